"""Queues: which waiting jobs may start an attempt now, in what order and how fast.

A pure core, as `lifecycle` is: no I/O and no clock. Every time is a float of seconds on the
wall clock (the shell passes `clock().timestamp()`), the clock the jobs' own timestamps are on.
Where state is kept across calls (the `QueueBook`, a `RetryWindow`) it is in memory and bounded.
What runs and what waits is rebuilt after a restart from the jobs' statuses ("status is the
only memory"); only the start rate's bucket and the retry window start afresh, which
loosens the limits by at most one burst and one floor (see `QueueBook`).

The rules (docs/design.md, "VigilQueue"):
- Order: priority (high first), then creation time, then name. A retry keeps its place: its key
  is its job's, so after its backoff it goes before younger jobs of the same priority.
- Capacity: attempts in Starting, Running or Uncertain count against `maxRunning`; BackingOff
  does not. `paused` starts nothing. `maxStartsPerSecond` is a token bucket (`TokenBucket`).
- Retry budget: the retries started over the last `RETRY_WINDOW_SECONDS` are at most
  `max(floor, retryBudget x starts)`, the retry itself counted among the starts (`RetryWindow`).
  A retry over budget waits (first attempts go past it meanwhile), never is dropped.
- A job whose queue does not exist waits for it, except on the queue named `default`: a job
  there runs unlimited until a `default` VigilQueue exists (the CRD defaults spec.queue to
  `default`, so this is "a job that names no queue").

The parts: `book` (the `QueueBook`: each queue's line, what runs, what starts next), `limits`
(the token bucket of maxStartsPerSecond and the retry budget's window), `heap` (the line's
data structure), `status` (a VigilQueue's status, read from the book).
"""
