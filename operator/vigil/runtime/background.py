"""One coroutine run in the background for as long as its owner runs: started once, cancelled and
awaited on stop, so no task outlives the part that made it (the certificate reloads and checks,
the issuer keys' first fetch)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class Background:
    def __init__(self, run: Callable[[], Coroutine[Any, Any, object]]) -> None:
        self.run = run
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """Cancels the coroutine and waits for it; what it raised (it has ended) is not raised here."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
