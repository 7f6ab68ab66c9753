"""Fixtures of the suites that run on a cluster (tests/integration/ and e2e/), a pytest plugin that
the repository's conftest.py loads; the helpers behind them are the rest of tests/support/.

`kube` is one real cluster for the whole session: the cluster $KUBECONFIG points at (a kind
cluster, say) when that is set, or else the local test bed, started here when it is not
running and stopped again at the end if this session started it. `namespace` is a fresh
namespace per test, deleted after it, watched by the session's operator (`vigil`);
`own_namespace` is one that operator leaves alone, for a test that runs operators of its own
(`own_operator`). `image` is Vigil's image of the checkout, built with podman (testbed/image.sh).
`real_node` is the bed's one real node (a kubelet with containerd, testbed/node.py), started once
for the session with that image and `plain_image` imported into it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import config

from testbed import cluster as testbed
from testbed import node as real_node_bed
from testbed.faults import FaultProxy, kubeconfig_via
from tests.support.agents import Agents
from tests.support.cluster import (
    SUITE_CLUSTER,
    Kube,
    fresh_namespace,
    install_crds,
    proxy_to_api_server,
    show_log,
)
from tests.support.images import build_image, plain_image
from tests.support.operators import OperatorProcess


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    given = os.environ.get("KUBECONFIG")
    started_here = False
    if given:
        if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:  # each worker's operator would act on all t-*
            pytest.fail(f"KUBECONFIG={given} is one cluster for every xdist worker: run the suite with -n 0")
        kubeconfig = Path(given)
    else:
        if not all(testbed.running_pid(SUITE_CLUSTER, c) for c in testbed.COMPONENTS):
            testbed.up(SUITE_CLUSTER, nodes=3)
            started_here = True
        kubeconfig = SUITE_CLUSTER.kubeconfig
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield Kube(kubeconfig=kubeconfig, api=api, on_testbed=not given)
    finally:
        api.close()
        if started_here and not os.environ.get("VIGIL_KEEP_CLUSTER"):
            testbed.down(SUITE_CLUSTER)


@pytest.fixture(scope="session")
def vigil(
    kube: Kube, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    """The CRDs installed and one operator for the session, watching the test namespaces (t-*)."""
    install_crds(kube)
    operator = OperatorProcess(kube, ["t-*"], tmp_path_factory.mktemp("operator") / "operator.log")
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
        if request.session.testsfailed:  # CI keeps no files: show what the operator said
            show_log(operator.log_path, 120)


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace t-*, which the session's operator (`vigil`) watches."""
    with fresh_namespace(kube, "t-", labels={"vigil.dev/test": "true"}, release=False) as name:
        yield name


@pytest.fixture
def own_namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace outside the session operator's t-*, for a test whose own operators act
    in it alone; its pods' attempt-tracking finalizers are released at the end (those operators
    are stopped by then)."""
    with fresh_namespace(kube, "o-") as name:
        yield name


@pytest.fixture
def own_operator(
    kube: Kube, own_namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., tuple[OperatorProcess, FaultProxy | None]]]:
    """`start(proxied=False, extra_args=())` -> (operator, proxy or None): `vigil operator` for
    `own_namespace` (with more flags), directly or through a fault proxy of its own; the CRDs
    installed first. Stopped at the end,
    its proxy healed first and stopped after, and its log shown if the test failed."""
    install_crds(kube)
    started: list[tuple[OperatorProcess, FaultProxy | None]] = []

    def start(proxied: bool = False, extra_args: tuple[str, ...] = ()) -> tuple[OperatorProcess, FaultProxy | None]:
        proxy, kubeconfig = None, None
        if proxied:
            proxy = proxy_to_api_server(kube, f"operator-{own_namespace}")
            kubeconfig = kubeconfig_via(proxy, kube.kubeconfig, tmp_path / "operator-via-proxy.kubeconfig")
        operator = OperatorProcess(
            kube, [own_namespace], tmp_path / "operator.log", kubeconfig=kubeconfig, extra_args=extra_args
        )
        operator.start()
        started.append((operator, proxy))
        return operator, proxy

    failed_before = request.session.testsfailed
    try:
        yield start
    finally:
        for operator, proxy in started:
            if proxy is not None:
                proxy.heal()
            operator.stop()
            if proxy is not None:
                proxy.stop()
        if started and request.session.testsfailed > failed_before:  # CI keeps no files: show what it said
            show_log(started[0][0].log_path)  # one log for all of them


@pytest.fixture(scope="session")
def image() -> str:
    """Vigil's image of the checkout as it is, by testbed/image.sh (`make test` has built it
    already, so this finds it in a fraction of a second); its name."""
    return build_image()


@pytest.fixture
def agents(kube: Kube, tmp_path: Path) -> Iterator[Agents]:
    """Starts agents (`agents.start(namespace, pod)`, `agents.add(agent)`); every one of them is
    stopped after the test, whatever happened."""
    started = Agents(kube, tmp_path)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def fault_proxy(kube: Kube, tmp_path: Path) -> Iterator[FaultProxy]:
    """A fault proxy in front of the cluster's API server, stopped after the test."""
    proxy = proxy_to_api_server(kube, f"p-{uuid.uuid4().hex[:8]}", home=tmp_path)
    try:
        yield proxy
    finally:
        proxy.stop()


@dataclass(frozen=True)
class RealNode:
    """The real node of the session's test bed, and the images it holds."""

    name: str
    vigil_image: str  # Vigil's image (the `image` fixture's name)
    plain_image: str  # tests.support.images.plain_image: no Python, nothing of Vigil
    placement: dict  # what a pod spec needs to land there: nodeSelector and toleration


@pytest.fixture(scope="session")
def real_node(kube: Kube, image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """One real node (kubelet + containerd, testbed/node.py) beside the kwok nodes, with Vigil's
    image and the plain image imported; started here unless it runs, stopped at the end if this
    session started it. It fails the tests that use it (never skips them) if it cannot start."""
    if not kube.on_testbed:
        pytest.fail("the real node is a part of the local test bed; $KUBECONFIG names another cluster")
    plain = plain_image()
    started_here = not real_node_bed.running(SUITE_CLUSTER)
    try:
        real_node_bed.up(SUITE_CLUSTER, [image, plain])
    except (testbed.ClusterError, OSError) as err:
        if started_here:  # what did start is stopped, its logs kept in the cluster's logs/
            real_node_bed.down(SUITE_CLUSTER)
        pytest.fail(f"the real node of the test bed could not start: {err}")
    try:
        yield RealNode(real_node_bed.node_name(SUITE_CLUSTER), image, plain, real_node_bed.POD_PLACEMENT)
    finally:
        if started_here and not os.environ.get("VIGIL_KEEP_CLUSTER"):
            real_node_bed.down(SUITE_CLUSTER)
