"""The previous release (0.1.0), as its users have it: the fixture e2e/fixtures/vigil-0.1.0.tar.gz
holds its operator (operator/vigil), its CRDs (crds/) and its chart (charts/vigil), made from the
tag by

    git archive --format=tar v0.1.0 operator/vigil crds charts/vigil | gzip -n -9 > e2e/fixtures/vigil-0.1.0.tar.gz

Kept as a file rather than read from git: a CI checkout may be shallow or carry no tags, and the
upgrade tests must run there all the same."""

from __future__ import annotations

import tarfile
from pathlib import Path

VERSION = "0.1.0"
FIXTURE = Path(__file__).resolve().parents[2] / "e2e" / "fixtures" / f"vigil-{VERSION}.tar.gz"


def extract(into: Path) -> Path:
    """The previous release's files under `into` (operator/vigil, crds, charts/vigil); `into`."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(into, filter="data")
    for needed in ("operator/vigil/cli.py", "crds/vigiljobs.vigil.dev.yaml", "charts/vigil/Chart.yaml"):
        assert (into / needed).exists(), f"{FIXTURE} lacks {needed}: make it again as this module says"
    return into
