"""The fault bed against the real kube-apiserver: a watch through a stalled proxy goes silent
while fresh requests get through, and the control plane comes back after a restart."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client, config, watch

from testbed import cluster as testbed
from testbed.faults import FaultProxy, kubeconfig_via
from tests.support.cluster import SUITE_CLUSTER, Kube
from tests.support.waits import deadline

pytestmark = pytest.mark.integration

# A stalled watch must stay silent this long while the object it watches changes. A bounded
# fixed window is the point of the check (nothing must arrive), not a wait for something.
SILENCE = 2.0
DEADLINE = deadline(15.0)  # a bound on anything the tests wait for
# The test's own ConfigMaps: every namespace also gets kube-root-ca.crt, which the watch ignores.
LABELS = {"vigil.dev/test": "faults"}
SELECTOR = "vigil.dev/test=faults"


@pytest.fixture
def via(kube: Kube, fault_proxy: FaultProxy, tmp_path: Path) -> Path:
    """A kubeconfig with the suite's identity that reaches the API server through the proxy."""
    return kubeconfig_via(fault_proxy, kube.kubeconfig, tmp_path / "via-proxy")


@pytest.fixture
def bed(kube: Kube) -> testbed.Cluster:
    # Restarting the control plane needs the local test bed; on a cluster given by $KUBECONFIG
    # there is nothing of ours to restart.
    if not kube.on_testbed:  # the same reason, and the same behaviour, as the fault matrix's
        pytest.skip("restarting the control plane needs the local test bed")
    return SUITE_CLUSTER


class ConfigMapWatch:
    """A watch on the ConfigMaps of one namespace, in a thread: names arrive on `events`, and
    the exception that ended the watch, if any, last."""

    def __init__(self, kubeconfig: Path, namespace: str):
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.events: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(namespace,), daemon=True)
        self.thread.start()

    def _run(self, namespace: str) -> None:
        core = client.CoreV1Api(self.api)
        try:
            # timeout_seconds bounds the watch on the server side and stops the client retrying.
            for event in watch.Watch().stream(
                core.list_namespaced_config_map,
                namespace,
                label_selector=SELECTOR,
                timeout_seconds=120,
                _request_timeout=(5, 120),
            ):
                self.events.put(event["object"].metadata.name)
        except Exception as err:  # the way the watch ended is what some tests look for
            self.events.put(err)
        else:
            self.events.put(EOFError("the watch ended"))

    def next(self, timeout: float = DEADLINE):
        return self.events.get(timeout=timeout)

    def close(self, proxy: FaultProxy) -> None:
        proxy.reset()  # ends the watch at once, whatever state it is in
        self.thread.join(timeout=DEADLINE)
        self.api.close()


def make_config_map(kube: Kube, namespace: str, name: str) -> None:
    kube.core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=LABELS)), _request_timeout=DEADLINE
    )


def test_a_stalled_watch_hears_nothing_while_a_fresh_request_gets_through(kube, namespace, fault_proxy, via):
    watcher = ConfigMapWatch(via, namespace)
    try:
        make_config_map(kube, namespace, "before")
        assert watcher.next() == "before"
        assert fault_proxy.stall()["connections"]["stalled"] >= 1

        make_config_map(kube, namespace, "during")
        fresh = config.new_client_from_config(config_file=str(via))
        try:
            got = client.CoreV1Api(fresh).read_namespaced_config_map("during", namespace, _request_timeout=DEADLINE)
            assert got.metadata.name == "during", "a new connection through the proxy works"
        finally:
            fresh.close()
        with pytest.raises(queue.Empty):
            watcher.next(timeout=SILENCE)

        fault_proxy.heal()
        assert watcher.next() == "during", "the healed watch delivers what it held"
    finally:
        watcher.close(fault_proxy)


def test_the_api_answers_again_after_kube_apiserver_restarts(kube, namespace, fault_proxy, via, bed):
    watcher = ConfigMapWatch(via, namespace)
    try:
        make_config_map(kube, namespace, "before")
        assert watcher.next() == "before"
        testbed.restart(bed, "kube-apiserver")
        # The old apiserver closed the watch; the proxy passed that on.
        ended = watcher.next()
        assert isinstance(ended, Exception), ended
    finally:
        watcher.close(fault_proxy)
    make_config_map(kube, namespace, "after")
    fresh = config.new_client_from_config(config_file=str(via))
    try:
        listed = client.CoreV1Api(fresh).list_namespaced_config_map(
            namespace, label_selector=SELECTOR, _request_timeout=DEADLINE
        )
        names = {cm.metadata.name for cm in listed.items}
    finally:
        fresh.close()
    assert {"before", "after"} <= names
    assert all(testbed.running_pid(bed, c) for c in testbed.COMPONENTS), "the other components rode it out"


def test_etcd_killed_without_fsync_keeps_acknowledged_writes(kube, namespace, bed):
    """A SIGKILL is not a power cut: --unsafe-no-fsync skips fdatasync only, and what etcd wrote
    to its WAL is in the page cache, which outlives the process."""
    make_config_map(kube, namespace, "acknowledged")
    began = time.monotonic()
    testbed.restart(bed, "etcd", kill=True)
    assert time.monotonic() - began < deadline(60)
    got = kube.core.read_namespaced_config_map("acknowledged", namespace, _request_timeout=DEADLINE)
    assert got.metadata.name == "acknowledged"
