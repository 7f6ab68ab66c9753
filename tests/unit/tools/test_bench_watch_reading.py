"""A smoke of bench.watch_reading (no cluster), so the script cannot rot: both paces read the
whole stream, and the paced one in fewer reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import watch_reading

pytestmark = pytest.mark.unit


def test_the_bench_reads_every_event_at_both_paces_and_reports_them(tmp_path: Path):
    assert watch_reading.main(["--rate", "50", "--seconds", "1", "--rounds", "1", "--out", str(tmp_path)]) == 0
    (figures,) = tmp_path.glob("watch-reading-*.json")
    results = json.loads(figures.read_text())["results"]
    unpaced, paced = results["0.0"][0], results[str(watch_reading.POD_WATCH_PACE_SECONDS)][0]
    assert unpaced["events"] == paced["events"] == 50
    assert paced["reads"] < unpaced["reads"] / 2, (paced["reads"], unpaced["reads"])
    assert all(r["cpu_seconds"] > 0 for r in (unpaced, paced))
    (table,) = tmp_path.glob("watch-reading-*.md")
    assert "| 0.1 |" in table.read_text() and "| 0 |" in table.read_text()
