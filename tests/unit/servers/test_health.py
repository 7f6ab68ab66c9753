"""/healthz fails, saying why, while a check (a supervised worker) reports trouble."""

from __future__ import annotations

import asyncio

import pytest

from vigil.servers import health

pytestmark = pytest.mark.unit


def answer(checks: list) -> tuple[int, str]:
    route = next(route for route in health.routes([], checks) if route.path == "/healthz")

    async def call() -> tuple[int, str]:
        response = await route.handler(None)  # type: ignore[arg-type]
        return response.status, response.text or ""

    return asyncio.run(call())


def test_healthz_is_ok_while_every_check_passes():
    assert answer([lambda: None, lambda: None]) == (200, "ok\n")


def test_healthz_fails_naming_what_is_wrong():
    status, text = answer([lambda: None, lambda: "vigiljob: a worker has been dead for 16s"])
    assert status == 503 and "vigiljob: a worker has been dead" in text
