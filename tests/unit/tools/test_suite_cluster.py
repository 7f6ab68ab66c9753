"""The suite's own cluster per pytest-xdist worker (tests/support/cluster.py): `make test` runs the
cluster tests as two workers, and two workers on one control plane would restart it under each
other and run two operators for the same namespaces."""

from __future__ import annotations

import pytest

from tests.support.cluster import suite_cluster

pytestmark = pytest.mark.unit


def test_outside_xdist_and_on_its_first_worker_the_suite_has_the_cluster_it_always_had() -> None:
    for environ in ({}, {"PYTEST_XDIST_WORKER": "gw0"}):
        cluster = suite_cluster(environ)
        assert (cluster.name, cluster.ports.apiserver) == ("pytest", 17443)


def test_every_other_worker_has_a_name_and_ports_of_its_own() -> None:
    clusters = [suite_cluster({"PYTEST_XDIST_WORKER": f"gw{n}"}) for n in range(4)]
    assert [c.name for c in clusters] == ["pytest", "pytest-1", "pytest-2", "pytest-3"]
    ports = [set(vars(c.ports).values()) for c in clusters]
    assert all(a.isdisjoint(b) for i, a in enumerate(ports) for b in ports[i + 1 :])


def test_the_name_and_base_given_still_apply_and_the_workers_follow_them() -> None:
    given = {"VIGIL_TEST_CLUSTER_NAME": "mine", "VIGIL_TEST_PORT_BASE": "30443", "PYTEST_XDIST_WORKER": "gw1"}
    cluster = suite_cluster(given)
    assert (cluster.name, cluster.ports.apiserver) == ("mine-1", 30453)
