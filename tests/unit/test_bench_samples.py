"""The benches read the operator's /metrics with `compare.sum_samples`: a wrong sum would move
every settle and every per-beat figure, so its reading of the text format is checked here."""

from __future__ import annotations

import pytest

from bench.compare import sum_samples

pytestmark = pytest.mark.unit

EXPOSITION = """\
# HELP vigil_jobs Jobs by phase.
# TYPE vigil_jobs gauge
vigil_jobs{phase="Running"} 9998.0
vigil_jobs{phase="Succeeded"} 2.0
vigil_jobs_total_seen 7.0
controller_runtime_reconcile_total{controller="vigiljob",result="success"} 40.0
controller_runtime_reconcile_total{controller="vigiljob",result="error"} 2.0
"""


def test_a_bare_name_sums_all_its_samples_and_a_labelled_one_reads_that_sample():
    sums = sum_samples(EXPOSITION, ["controller_runtime_reconcile_total", 'vigil_jobs{phase="Running"}', "vigil_jobs"])
    assert sums == {
        "controller_runtime_reconcile_total": 42.0,
        'vigil_jobs{phase="Running"}': 9998.0,
        "vigil_jobs": 10000.0,  # not vigil_jobs_total_seen: a longer name is another metric
    }


def test_a_metric_not_exposed_reads_zero():
    assert sum_samples(EXPOSITION, ["vigil_heartbeats_total"]) == {"vigil_heartbeats_total": 0.0}
