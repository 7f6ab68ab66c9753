"""The process's generic machinery: the one clock (`clock`), keyed timers on it (`timers`), and
the work queue (`workqueue`)."""
