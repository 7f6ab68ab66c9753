"""Queue-book fixtures shared by the pure tests of queueing: one queue, entries waiting in it,
a book holding them, on a fixed wall clock."""

from __future__ import annotations

from vigil.core.queueing.book import QueueBook, QueueEntry, QueueSpec, Standing

NS, Q = "team", "batch"
QK = (NS, Q)
T0 = 1_700_000_000.0  # the wall clock, in seconds


def waiting(name: str, priority: int = 0, created: float = 0.0, **kw: object) -> QueueEntry:
    return QueueEntry(NS, name, kw.pop("queue", Q), priority, T0 + created, Standing.QUEUED, **kw)  # type: ignore[arg-type]


def book_of(spec: QueueSpec, *views: QueueEntry, now: float = T0) -> QueueBook:
    book = QueueBook()
    book.set_queue(NS, Q, spec, now)
    for view in views:
        book.observe(view)
    return book
