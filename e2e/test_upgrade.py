"""An upgrade from the previous release, mid-flight: what a user who runs v0.1.0 gets when they
follow docs/upgrading.md with jobs in every state.

The previous release is the fixture of its files (tests/support/previous.py), its CRDs (v1alpha1 alone) applied and
its operator run as a process; jobs are written as v1alpha1 in each state: running, backing off,
dead-lettered, queued behind a saturated queue (and one in a namespace no operator watches, which
nothing but the migration ever writes). Then, while they are so, this release's CRDs are
applied server-side (the old operator still running), the old operator stopped and this
release's operator started. Nothing may be lost
(every job ends as it would have: the running one and the queued ones Succeeded after one
attempt, the one backing off Succeeded after its second, the dead-lettered one still so after its
one), nothing run twice (no attempt number gets two pods, none gets a number beyond its last,
the queue never runs two at once), and every job reads the same through both versions. Then
`vigil migrate-storage` rewrites every object: etcd holds them all as v1beta1, changed in nothing
else, both CRDs' storedVersions is [v1beta1], and v1alpha1 still answers, with the deprecation
warning kubectl prints.

The CRDs are cluster-wide and an old CRD cannot be applied over one that has stored v1beta1
objects, so the test brings up a test bed of its own beside the suite's (the suite's name with
`-upgrade`, its ports 100 above the suite's base), and stops it at the end.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from testbed import cluster as testbed
from tests.support import previous
from tests.support.cluster import SUITE_CLUSTER, Kube, free_port, fresh_namespace, simulated_pod_spec
from tests.support.operators import OperatorProcess
from tests.support.waits import deadline, wait_until
from tests.support.watchers import PodLog, PodWatch
from tests.support.webhooks import register_and_wait, unregister
from vigil.servers.webhook import PATH, WEBHOOK_NAME, make_self_signed, webhook_configuration

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
GROUP, OLD, NEW = "vigil.dev", "v1alpha1", "v1beta1"
CRDS = ("vigiljobs.vigil.dev", "vigilqueues.vigil.dev")
PORT_OFFSET = 100  # the bed of this test: ports above the suite's and its xdist workers' (10 each)

# One attempt per job unless said; a pod's life is kwok's stages (tests/README.md).
# The workload's pace is not widened by the slack: these leave the steps before the upgrade (about
# 15 s on an idle bed) room to take three times as long, and the jobs are still mid-flight then.
LONG = "60s"  # the running job
BACKOFF = {"initialSeconds": 45, "factor": 2.0, "maxSeconds": 90, "jitter": 0.0}  # the job backing off


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's files (tests/support/previous.py)."""
    return previous.extract(tmp_path_factory.mktemp("previous-release"))


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[Kube, testbed.Cluster]]:
    """A test bed of this test's own, empty: no CRD installed."""
    if os.environ.get("KUBECONFIG"):
        pytest.fail(
            "the upgrade test installs the previous release's CRDs, which a cluster that has stored v1beta1 "
            "objects refuses: it brings up a test bed of its own and needs the local one (unset KUBECONFIG)"
        )
    bed = testbed.Cluster(
        f"{SUITE_CLUSTER.name}-upgrade", testbed.Ports.from_base(SUITE_CLUSTER.ports.apiserver + PORT_OFFSET)
    )
    if any(testbed.running_pid(bed, component) for component in testbed.COMPONENTS):
        testbed.down(bed)  # a bed kept from an earlier run (VIGIL_KEEP_CLUSTER) holds this release's CRDs
    testbed.up(bed, nodes=3)
    api = config.new_client_from_config(config_file=str(bed.kubeconfig))
    try:
        yield Kube(kubeconfig=bed.kubeconfig, api=api, on_testbed=True), bed
    finally:
        api.close()
        if not os.environ.get("VIGIL_KEEP_CLUSTER"):
            testbed.down(bed)


def apply_crds(kube: Kube, folder: Path) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(folder))
    extensions = client.ApiextensionsV1Api(kube.api)

    def established(name: str) -> bool:
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    for name in CRDS:
        wait_until(lambda name=name: established(name), 60, f"CRD {name} to be established")


def job(name: str, exit_code: str, run_for: str, **spec: object) -> dict:
    annotations, pod_spec = simulated_pod_spec(exit_code, run_for)
    return {
        "apiVersion": f"{GROUP}/{OLD}",
        "kind": "VigilJob",
        "metadata": {"name": name},
        "spec": {
            "template": {"metadata": {"annotations": annotations}, "spec": pod_spec},
            "heartbeat": {"required": False},
            **spec,
        },
    }


def queue(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{OLD}", "kind": "VigilQueue", "metadata": {"name": name}}


def create(kube: Kube, namespace: str, body: dict, plural: str = "vigiljobs") -> None:
    kube.custom.create_namespaced_custom_object(GROUP, OLD, namespace, plural, body)


def read(kube: Kube, namespace: str, name: str, version: str = NEW, plural: str = "vigiljobs") -> dict:
    return kube.custom.get_namespaced_custom_object(GROUP, version, namespace, plural, name)


def status(kube: Kube, namespace: str, name: str, version: str = NEW) -> dict:
    return read(kube, namespace, name, version).get("status") or {}


def wait_status(
    kube: Kube,
    namespace: str,
    name: str,
    what: str,
    check: Callable[[dict], bool],
    timeout: float = 60,
    version: str = NEW,
) -> dict:
    """Waits until the job's status passes `check`, read through `version` (before the upgrade,
    the previous release's CRD serves v1alpha1 alone)."""
    wait_until(
        lambda: check(status(kube, namespace, name, version)),
        timeout,
        f"{name} {what} (now {status(kube, namespace, name, version)})",
    )
    return status(kube, namespace, name, version)


def stored_versions_in_etcd(bed: testbed.Cluster) -> dict[str, str]:
    """Every Vigil object's key in etcd and the apiVersion it is stored as (custom resources are
    stored as JSON): what the API server would read back, whatever its caches say."""
    encode = lambda raw: base64.b64encode(raw.encode()).decode()  # noqa: E731
    prefix = f"/registry/{GROUP}/"
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": encode(prefix), "range_end": encode(end)}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{bed.ports.etcd_client}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=deadline(10)) as answer:
        kvs = json.load(answer).get("kvs") or []
    return {base64.b64decode(kv["key"]).decode(): json.loads(base64.b64decode(kv["value"]))["apiVersion"] for kv in kvs}


def readable(obj: dict) -> dict:
    """What a reader relies on, whatever apiVersion it asked through."""
    meta = obj["metadata"]
    return {
        "uid": meta["uid"],
        "generation": meta.get("generation"),
        "labels": meta.get("labels"),
        "annotations": meta.get("annotations"),
        "spec": obj.get("spec"),
        "status": obj.get("status"),
    }


def both_versions(kube: Kube, namespace: str, name: str, plural: str) -> tuple[dict, dict]:
    """The object read through v1beta1 and v1alpha1 at one resourceVersion (read again if the
    operator wrote it between the two reads)."""

    def read_both() -> tuple[dict, dict] | None:
        as_new, as_old = read(kube, namespace, name, NEW, plural), read(kube, namespace, name, OLD, plural)
        return (
            (as_new, as_old) if as_new["metadata"]["resourceVersion"] == as_old["metadata"]["resourceVersion"] else None
        )

    return wait_until(read_both, 30, f"{name} read at one version through both API versions")


def test_an_upgrade_mid_flight_loses_nothing_runs_nothing_twice_and_migrates_storage(
    bed: tuple[Kube, testbed.Cluster], old_tree: Path, tmp_path: Path
) -> None:
    kube, cluster = bed
    apply_crds(kube, old_tree / "crds")
    served = client.ApiextensionsV1Api(kube.api).read_custom_resource_definition(CRDS[0]).spec.versions
    assert [v.name for v in served] == [OLD], "the previous release's CRD serves v1alpha1 alone"

    with (
        fresh_namespace(kube, "u-") as ns,
        fresh_namespace(kube, "uq-") as queued_ns,
        fresh_namespace(kube, "unwatched-") as unwatched,
        PodLog(kube, ns) as pods,
        PodLog(kube, queued_ns) as queued_pods,
        PodWatch(kube, queued_ns) as queue_watch,
    ):
        old = OperatorProcess(kube, [ns, queued_ns], tmp_path / "old-operator.log", tree=old_tree)
        # This release's operator serves its admission webhook too, registered as the chart does
        # (v1beta1, matchPolicy Equivalent): a create through v1alpha1 must still be reviewed.
        certs, port = tmp_path / "certs", free_port()
        ca = make_self_signed(certs, ip_addresses=["127.0.0.1"])
        webhook = ("--webhook-address", f"127.0.0.1:{port}")
        webhook += ("--webhook-cert-file", str(certs / "tls.crt"), "--webhook-key-file", str(certs / "tls.key"))
        new = OperatorProcess(kube, [ns, queued_ns], tmp_path / "new-operator.log", extra_args=webhook)
        try:
            old.start()
            # Every object written as v1alpha1, as a user of the previous release wrote them.
            create(kube, queued_ns, {**queue("one"), "spec": {"maxRunning": 1}}, "vigilqueues")
            create(kube, ns, job("running", "0", LONG))
            create(kube, ns, job("backing-off", "1,0", "1s", retry={"maxAttempts": 3, "backoff": BACKOFF}))
            create(kube, ns, job("poison", "7", "1s", retry={"maxAttempts": 3, "nonRetryableExitCodes": [7]}))
            create(kube, queued_ns, job("first", "0", "45s", queue="one"))
            wait_status(
                kube,
                queued_ns,
                "first",
                "to be Running in queue one",
                lambda s: s.get("phase") == "Running",
                version=OLD,
            )
            for name in ("second", "third"):
                create(kube, queued_ns, job(name, "0", "1s", queue="one"))
            create(kube, unwatched, job("untouched", "0", "1s"))

            wait_status(kube, ns, "running", "Running", lambda s: s.get("phase") == "Running", version=OLD)
            wait_status(
                kube,
                ns,
                "backing-off",
                "BackingOff after attempt 1",
                lambda s: s.get("phase") == "BackingOff" and s.get("attempts") == 1,
                version=OLD,
            )
            wait_status(kube, ns, "poison", "DeadLettered", lambda s: s.get("phase") == "DeadLettered", version=OLD)
            for name in ("second", "third"):
                wait_status(
                    kube,
                    queued_ns,
                    name,
                    "Queued behind the saturated queue",
                    lambda s: s.get("phase") == "Queued",
                    version=OLD,
                )

            # The upgrade, as docs/upgrading.md has it: this release's CRDs (the old operator runs on
            # meanwhile, through v1alpha1), then the old operator replaced by the new one.
            apply_crds(kube, ROOT / "crds")
            old.stop()
            assert old.proc is not None and old.proc.returncode == 0, old.log()[-3000:]
            before = {name: status(kube, ns, name, OLD) for name in ("running", "backing-off", "poison")}
            assert before["running"]["phase"] == "Running" and before["backing-off"]["phase"] == "BackingOff"
            new.start()

            # Nothing lost: every job ends as it would have without the upgrade.
            done = lambda s: s.get("phase") in ("Succeeded", "DeadLettered")  # noqa: E731
            running = wait_status(kube, ns, "running", "to finish", done, timeout=120)
            backed_off = wait_status(kube, ns, "backing-off", "to finish", done, timeout=120)
            for name in ("first", "second", "third"):
                finished = wait_status(kube, queued_ns, name, "to finish", done, timeout=120)
                assert (finished["phase"], finished["attempts"]) == ("Succeeded", 1), (name, finished)
            assert (running["phase"], running["attempts"]) == ("Succeeded", 1), running
            assert running["history"][0]["podName"] == before["running"]["currentAttempt"]["podName"]
            assert (backed_off["phase"], backed_off["attempts"]) == ("Succeeded", 2), backed_off
            assert [(h["number"], h["outcome"]) for h in backed_off["history"]] == [(1, "Failed"), (2, "Succeeded")]
            poison = status(kube, ns, "poison")
            assert (poison["phase"], poison["attempts"], poison["reason"]) == (
                "DeadLettered",
                1,
                before["poison"]["reason"],
            )

            # Nothing run twice: one pod per attempt, no attempt number beyond the job's last,
            # and the queue's maxRunning held across the two operators.
            pods.caught_up()
            queued_pods.caught_up()
            queue_watch.caught_up()
            attempts = {**{n: 1 for n in ("running", "poison")}, "backing-off": 2}
            uids = {name: read(kube, ns, name)["metadata"]["uid"] for name in attempts}
            uids |= {name: read(kube, queued_ns, name)["metadata"]["uid"] for name in ("first", "second", "third")}
            attempts |= {name: 1 for name in ("first", "second", "third")}
            seen = {**pods.seen, **queued_pods.seen}
            for name, uid in uids.items():
                numbers = sorted(int(attempt) for (job_uid, attempt) in seen if job_uid == uid)
                assert numbers == list(range(1, attempts[name] + 1)), (name, numbers)
                for (job_uid, attempt), pod_uids in seen.items():
                    assert job_uid != uid or len(pod_uids) == 1, f"{name} attempt {attempt} had pods {pod_uids}"
            queue_watch.assert_healthy()
            assert queue_watch.duplicates() == []
            assert queue_watch.max_active == 1, queue_watch.events

            # Every object reads the same through both versions.
            for namespace, name, plural in (
                *((ns, n, "vigiljobs") for n in ("running", "backing-off", "poison")),
                (queued_ns, "one", "vigilqueues"),
                (unwatched, "untouched", "vigiljobs"),
            ):
                as_new, as_old = both_versions(kube, namespace, name, plural)
                assert (as_new["apiVersion"], as_old["apiVersion"]) == (f"{GROUP}/{NEW}", f"{GROUP}/{OLD}")
                assert readable(as_new) == readable(as_old), name

            # The storage migration: before it, what nothing wrote since the upgrade is still
            # v1alpha1 in etcd (the job no operator watches, at least).
            in_etcd = stored_versions_in_etcd(cluster)
            untouched_key = f"/registry/{GROUP}/vigiljobs/{unwatched}/untouched"
            assert in_etcd[untouched_key] == f"{GROUP}/{OLD}", in_etcd
            extensions = client.ApiextensionsV1Api(kube.api)
            for name in CRDS:
                assert extensions.read_custom_resource_definition(name).status.stored_versions == [OLD, NEW]
            kept = {
                (namespace, name): read(kube, namespace, name)
                for namespace, name in ((ns, "poison"), (unwatched, "untouched"))
            }
            migrated = subprocess.run(
                [str(Path(sys.executable).with_name("vigil")), "migrate-storage", "--rate", "50"],
                env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)},
                capture_output=True,
                text=True,
                timeout=deadline(120),
            )
            assert migrated.returncode == 0, migrated.stderr
            assert "storedVersions: [v1beta1]" in migrated.stdout, migrated.stdout
            in_etcd = stored_versions_in_etcd(cluster)
            assert in_etcd and set(in_etcd.values()) == {f"{GROUP}/{NEW}"}, in_etcd
            for name in CRDS:
                assert extensions.read_custom_resource_definition(name).status.stored_versions == [NEW]
            for (namespace, name), was in kept.items():  # rewritten, changed in nothing a user reads
                assert readable(read(kube, namespace, name)) == readable(was), name

            # Admission reviews a create through v1alpha1 (converted to v1beta1 under Equivalent).
            configuration = webhook_configuration("vigil-upgrade", ca, url=f"https://127.0.0.1:{port}{PATH}")
            assert configuration["webhooks"][0]["rules"][0]["apiVersions"] == [NEW]
            register_and_wait(
                kube,
                configuration,
                ns,
                lambda name: create(kube, ns, {**queue(name), "spec": {"maxQueued": 0}}, "vigilqueues"),
            )
            refused = kube.kubectl(
                "create", "-n", ns, "-f", "-", input=json.dumps(job("refused", "0", "1s", queue="probe")), check=False
            )
            assert refused.returncode != 0, refused.stdout
            assert f'admission webhook "{WEBHOOK_NAME}" denied the request: queue "probe"' in refused.stderr, (
                refused.stderr
            )
            unregister(kube.api, "vigil-upgrade")

            # v1alpha1 is still served, with the warning that says what to change.
            got = kube.kubectl("get", f"vigiljobs.{OLD}.{GROUP}", "-n", ns, "poison", "-o", "json")
            assert json.loads(got.stdout)["apiVersion"] == f"{GROUP}/{OLD}"
            warning = f"Warning: {GROUP}/{OLD} VigilJob is deprecated"
            assert warning in got.stderr and f"use {GROUP}/{NEW}" in got.stderr, got.stderr
            made = kube.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(job("after", "0", "1s")))
            assert warning in made.stderr, made.stderr
            after = wait_status(kube, ns, "after", "to finish", done, timeout=60)
            assert (after["phase"], after["attempts"]) == ("Succeeded", 1), after
            # written as v1alpha1, defaulted by the schema and stored as v1beta1
            assert read(kube, ns, "after")["spec"]["retry"]["maxAttempts"] == 6
            assert stored_versions_in_etcd(cluster)[f"/registry/{GROUP}/vigiljobs/{ns}/after"] == f"{GROUP}/{NEW}"
        finally:
            old.stop()
            new.stop()
            for log in (old, new):
                sys.stderr.write(f"--- {log.log_path.name} (last lines)\n{log.log()[-2000:]}\n")
