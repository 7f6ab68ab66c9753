"""A smoke of bench.beat_protocol (no cluster), so the script cannot rot: both ways serve the
real endpoint over TLS, every beat is answered Renewed, and the table reports both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import beat_protocol

pytestmark = pytest.mark.unit


def test_the_bench_beats_through_both_ways_and_reports_them(tmp_path: Path):
    argv = ["--connections", "20", "--rate", "40", "--seconds", "1", "--rounds", "1", "--out", str(tmp_path)]
    assert beat_protocol.main(argv) == 0
    (figures,) = tmp_path.glob("beat-protocol-*.json")
    results = json.loads(figures.read_text())["results"]
    assert set(results) == set(beat_protocol.MODES)
    for mode, (run,) in results.items():
        assert run["failed"] == 0, (mode, run)
        assert run["beats"] >= 20, (mode, run)  # 40 a second for a second, less the edges of the window
        assert 10 < run["server_rss_mib"] < 1024, (mode, run)  # a Python process's, read from /proc
    (table,) = tmp_path.glob("beat-protocol-*.md")
    assert "| aiohttp |" in table.read_text() and "| protocol |" in table.read_text()
