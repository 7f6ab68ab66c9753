"""A smoke of bench.agent_beat (no cluster), so the script cannot rot: both clients beat through
the operator's real endpoint over TLS, every beat is answered Renewed, and the table has both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import agent_beat

pytestmark = pytest.mark.unit


def test_the_bench_beats_through_both_clients_and_reports_them(tmp_path: Path):
    assert agent_beat.main(["--pods", "5", "--beats", "2", "--rounds", "1", "--out", str(tmp_path)]) == 0
    (figures,) = tmp_path.glob("agent-beat-*.json")
    results = json.loads(figures.read_text())["results"]
    assert set(results) == set(agent_beat.MODES)
    for mode, (run,) in results.items():
        assert run["beats"] == 10 and run["refused"] == 0, (mode, run)
        assert run["client_cpu_ms_per_beat"] > 0, (mode, run)
    (table,) = tmp_path.glob("agent-beat-*.md")
    assert "| aiohttp |" in table.read_text() and "| socket |" in table.read_text()
