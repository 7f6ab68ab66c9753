"""The User-Agent of Vigil's requests, in a module of its own: the agent's blocking client
(`vigil.agent.transport`) sends it too, without importing aiohttp through `vigil.kube.client`."""

from __future__ import annotations

from vigil import __version__


def user_agent(identity: str | None = None, role: str | None = None) -> str:
    """The User-Agent of this process's requests: `vigil/<version> (<identity>)`, and
    `vigil/<version> (<identity>; leader-election)` for its Lease. The API server's audit log
    records it with every request, so a reader tells the replicas of one Deployment apart, and
    the election's writes from the operator's, without any other setup."""
    details = "; ".join(part for part in (identity, role) if part)
    return f"vigil/{__version__}" + (f" ({details})" if details else "")
