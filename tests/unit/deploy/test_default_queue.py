"""The chart runs the operator with the cluster-wide default queue policy on, as the safe
default for a shared cluster, and lets it be turned off."""

from __future__ import annotations

import pytest

from tests.support.charts import helm_template

pytestmark = pytest.mark.unit


def operator_args(*sets: str, jsons: tuple[str, ...] = ()) -> list[str]:
    (deployment,) = [doc for doc in helm_template(*sets, jsons=jsons) if doc["kind"] == "Deployment"]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    return container["args"]


def test_by_default_namespaces_without_a_default_queue_are_capped_and_budgeted():
    args = operator_args()
    assert "--default-queue-max-running=100" in args
    assert "--default-queue-retry-budget=0.2" in args


def test_the_policy_follows_the_values_and_null_turns_it_off():
    args = operator_args("operator.defaultQueue.maxRunning=7", jsons=("operator.defaultQueue.retryBudget=0.5",))
    assert {"--default-queue-max-running=7", "--default-queue-retry-budget=0.5"} <= set(args)
    assert not [a for a in operator_args("operator.defaultQueue.maxRunning=null") if a.startswith("--default-queue")]
