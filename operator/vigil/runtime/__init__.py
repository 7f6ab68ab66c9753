"""The process's generic machinery: the one clock (`clock`), keyed timers on it (`timers`), and
the work queue (`workqueue`), and the heap given back after a peak (`memory`)."""
