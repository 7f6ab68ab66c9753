"""The reconcilers: a generic worker (`worker`), the VigilJob controller (`jobs`), the VigilQueue
status controller (`queues`), and the queue dispatcher both share (`dispatcher`)."""
