"""The chart's operator logs JSON by default (a cluster's logs go to a pipeline that parses them),
and its pre-delete hook too; `operator.logFormat=text` for people reading `kubectl logs`."""

from __future__ import annotations

import pytest

from tests.support.charts import helm_template

pytestmark = pytest.mark.unit


def args_by_container(docs: list[dict]) -> dict[str, list[str]]:
    found = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                found[container["name"]] = container["args"]
    return found


def test_the_operator_and_its_hook_log_json_by_default_and_text_when_asked():
    by_default = args_by_container(helm_template())
    assert {"operator", "release-finalizers"} <= set(by_default)
    for name in ("operator", "release-finalizers"):
        assert "--log-format=json" in by_default[name], name
    text = args_by_container(helm_template("operator.logFormat=text"))
    assert "--log-format=text" in text["operator"] and "--log-format=text" in text["release-finalizers"]


def test_a_format_the_operator_does_not_know_is_refused_at_install():
    with pytest.raises(AssertionError, match="logFormat"):  # helm refuses it by the schema
        helm_template("operator.logFormat=yaml")
