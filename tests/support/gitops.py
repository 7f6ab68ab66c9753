"""What Argo CD reads from a VigilJob or VigilQueue: our Lua health checks (gitops/argocd), run
by a real Lua interpreter (lupa); and the readings expected of the objects recorded live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa  # in the test extra

ROOT = Path(__file__).resolve().parents[2]
ARGO = ROOT / "gitops" / "argocd" / "vigil.dev"

# Objects read from a live API server in each phase by e2e/test_kstatus.py
# (VIGIL_RECORD_GITOPS_FIXTURES=1 records them again), with what kstatus (cli-utils v0.37.2)
# computed for each at the time. The Lua checks must read them as Argo CD users expect, and the
# live objects must read so too: one table for both.
RECORDINGS = ROOT / "tests" / "unit" / "deploy" / "fixtures" / "gitops"
EXPECTED = {  # recording: (Argo CD health, kstatus status)
    "job-running": ("Progressing", "InProgress"),
    "job-queued": ("Progressing", "InProgress"),
    "job-queued-paused": ("Progressing", "InProgress"),
    "job-backing-off": ("Progressing", "InProgress"),
    "job-succeeded": ("Healthy", "Current"),
    "job-dead-lettered": ("Degraded", "Failed"),
    "job-suspended": ("Suspended", "Current"),  # kstatus has no Suspended
    "job-not-yet-seen": ("Progressing", "InProgress"),  # status defaults to observedGeneration 0 (crd.py)
    "job-generation-not-observed": ("Progressing", "InProgress"),
    "job-succeeded-edited-observed": ("Healthy", "Current"),
    "job-unseen-then-succeeded": ("Healthy", "Current"),
    "queue-ready": ("Healthy", "Current"),
    "queue-saturated": ("Healthy", "Current"),
    "queue-paused": ("Suspended", "Current"),
    "queue-not-yet-seen": ("Progressing", "InProgress"),
    "queue-generation-not-observed": ("Progressing", "InProgress"),
}


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) as Argo CD's health check of `kind` computes them for `obj`."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute((ARGO / kind / "health.lua").read_text())
    return result["status"], result["message"]
