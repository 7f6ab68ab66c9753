"""`kubectl vigil top`'s worker pools (vigil.plugin.report.pool_rows, vigil.plugin.render.top):
each VigilWorkerPool from its spec and the status Vigil writes, its conditions in trouble, and the
table, wide table, names and documents it prints beside the queues."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.support.plugin import queue, worker_pool
from vigil.plugin import render, report

pytestmark = pytest.mark.unit


def condition(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": "x"}


READY = condition("Ready", "True", "WorkersReady", "4 of 4 workers ready")
BELOW = condition("AtMaximum", "False", "BelowMaximum", "the backlog asks for 4 workers, within maxReplicas (4)")
SATURATED = worker_pool(
    "render",
    namespace="team-b",
    spec={"maxReplicas": 4, "slotsPerWorker": 2},
    status={
        "replicas": 4,
        "readyReplicas": 3,
        "desiredReplicas": 4,
        "slots": 6,
        "slotsUsed": 6,
        "backlog": 41,
        "conditions": [
            condition("Ready", "False", "WorkersNotReady", "3 of 4 workers ready"),
            condition("AtMaximum", "True", "AtMaximum", "the backlog asks for 24 workers, more than maxReplicas (4)"),
        ],
    },
)
HEALTHY = worker_pool(
    "etl",
    spec={"minReplicas": 2, "maxReplicas": 8, "slotsPerWorker": 4},
    status={
        "replicas": 4,
        "readyReplicas": 4,
        "desiredReplicas": 4,
        "slots": 16,
        "slotsUsed": 9,
        "backlog": 0,
        "conditions": [READY, BELOW],
    },
)
NEW = worker_pool("fresh", spec={"replicas": 3})  # Vigil has not written its status yet


def test_a_pools_row_is_its_spec_and_status_with_its_conditions_in_trouble_only():
    rows = report.pool_rows([SATURATED, NEW, HEALTHY])
    assert [(row["namespace"], row["name"]) for row in rows] == [("ns", "etl"), ("ns", "fresh"), ("team-b", "render")]
    etl, fresh, saturated = rows
    assert etl == {
        "name": "etl",
        "namespace": "ns",
        "replicas": 4,
        "readyReplicas": 4,
        "desiredReplicas": 4,
        "minReplicas": 2,
        "maxReplicas": 8,
        "scaledBy": "backlog",
        "slotsPerWorker": 4,
        "slots": 16,
        "slotsUsed": 9,
        "backlog": 0,
        "ready": "True",
        "conditions": [],
    }
    assert [(c["type"], c["status"], c["reason"]) for c in saturated["conditions"]] == [
        ("Ready", "False", "WorkersNotReady"),
        ("AtMaximum", "True", "AtMaximum"),
    ]
    assert saturated["conditions"][1]["message"] == "the backlog asks for 24 workers, more than maxReplicas (4)"
    # Before Vigil's first write: no counts, the CRD's defaults, scaled by spec.replicas.
    assert (fresh["readyReplicas"], fresh["backlog"], fresh["ready"], fresh["conditions"]) == (None, None, None, [])
    assert (fresh["minReplicas"], fresh["maxReplicas"], fresh["slotsPerWorker"]) == (1, 10, 1)
    assert fresh["scaledBy"] == "spec.replicas"


def test_top_prints_the_pools_table_after_the_queues_with_workers_slots_backlog_and_conditions():
    queues = report.queue_rows([queue("nightly")])
    pools = report.pool_rows([HEALTHY, SATURATED, NEW])
    tables = render.top(queues, "table", namespaces=True, pools=pools).split("\n\n")
    assert len(tables) == 2 and tables[0].startswith("NAMESPACE   QUEUE")
    assert tables[1].splitlines() == [
        "NAMESPACE   POOL     WORKERS   MAX   SLOTS   BACKLOG   CONDITIONS",
        "ns          etl      4/4       8     9/16    0         -",
        "ns          fresh    -         10    -       -         -",
        "team-b      render   3/4       4     6/6     41        Ready=False (WorkersNotReady), AtMaximum",
    ]
    wide = render.top(queues, "wide", pools=pools).split("\n\n")[1].splitlines()
    assert wide[0].split()[-5:] == ["REPLICAS", "MIN", "SLOTS-PER-WORKER", "SCALED-BY", "MESSAGE"]
    assert wide[2].split()[-5:] == ["-", "1", "1", "spec.replicas", "-"]
    assert wide[3].endswith("3 of 4 workers ready; the backlog asks for 24 workers, more than maxReplicas (4)"), (
        "-o wide: the messages of the conditions in trouble"
    )


def test_top_without_pools_prints_the_queues_as_before_and_without_queues_the_pools_alone():
    queues = report.queue_rows([queue("nightly")])
    assert render.top(queues, "table", pools=[]) == render.top(queues, "table")
    assert render.top([], "table", pools=[]) == render.top([], "table"), "an empty cluster: the queues' headers"
    alone = render.top([], "table", pools=report.pool_rows([HEALTHY]))
    assert alone.splitlines()[0].startswith("POOL") and "\n\n" not in alone
    quiet = render.top(queues, render.parse_output("table", no_headers=True), pools=report.pool_rows([HEALTHY]))
    assert [line.split()[0] for line in quiet.splitlines() if line] == ["nightly", "etl"]


def test_top_documents_hold_the_pools_beside_the_queues_and_name_lists_both():
    queues = report.queue_rows([queue("nightly")])
    pools = report.pool_rows([HEALTHY, SATURATED])
    document = json.loads(render.top(queues, "json", pools=pools))
    assert [item["name"] for item in document["items"]] == ["nightly"], "the queues stay the items"
    assert [pool["metadata"] for pool in document["pools"]] == [
        {"name": "etl", "namespace": "ns"},
        {"name": "render", "namespace": "team-b"},
    ]
    assert document["pools"][1]["backlog"] == 41 and document["pools"][1]["conditions"][1]["type"] == "AtMaximum"
    assert yaml.safe_load(render.top(queues, "yaml", pools=pools)) == document
    assert "pools" not in json.loads(render.top(queues, "json")), "pools not read: not said to be none"
    jsonpath = render.parse_output("jsonpath={.pools[*].name}")
    assert render.top(queues, jsonpath, pools=pools) == "etl render"
    assert render.top(queues, "name", pools=pools).splitlines() == [
        "vigilqueue.vigil.dev/nightly",
        "vigilworkerpool.vigil.dev/etl",
        "vigilworkerpool.vigil.dev/render",
    ]
