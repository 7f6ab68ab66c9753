"""Heartbeats posted to the leader (issue 26), end to end on the bed: `vigil operator` serving
/v1/heartbeat on its beat server (HTTPS, a port of its own), real projected tokens from the API server's
TokenRequest (bound to the kwok pod, audience vigil.dev, as the kubelet mounts them), verified by
the operator against the cluster's published keys. A beat there writes nothing to the API server;
a forged one is refused and changes nothing.

Timings: interval 1 s, timeout 6 s (Uncertain after 3 s of silence, Lost after 6 s).
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import grant_heartbeat_rbac, heartbeat_job, pod_token
from tests.support.cluster import Kube, free_port, read_pod
from tests.support.jobs import create, status, wait_phase
from tests.support.waits import deadline, holds, wait_until
from vigil.core.manifest import BEAT_TOKEN_VOLUME
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.e2e


class Beats:
    """Posts beats to the operator's endpoint as an agent does (one keep-alive connection)."""

    def __init__(self, port: int, ca: Path) -> None:
        self.port, self.context = port, ssl.create_default_context(cafile=str(ca))

    def post(self, token: str, namespace: str, name: str, uid: str = "", beat: str = "1:test") -> tuple[int, dict]:
        body = {"namespace": namespace, "name": name, "beat": beat, **({"uid": uid} if uid else {})}
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=deadline(5))
        try:
            connection.request(
                "POST",
                "/v1/heartbeat",
                body=json.dumps(body),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            connection.close()


@pytest.fixture
def leader_beats(kube: Kube, own_namespace: str, own_operator, tmp_path: Path) -> Beats:
    grant_heartbeat_rbac(kube, own_namespace)
    make_self_signed(tmp_path / "certs")
    port = free_port()
    own_operator(
        extra_args=(
            "--beat-address", f"127.0.0.1:{port}",
            "--beat-cert-file", str(tmp_path / "certs" / "tls.crt"),
            "--beat-key-file", str(tmp_path / "certs" / "tls.key"),
            "--heartbeat-url", f"https://127.0.0.1:{port}/v1/heartbeat",
            "--heartbeat-ca-file", str(tmp_path / "certs" / "ca.crt"),
        )
    )  # fmt: skip
    return Beats(port, tmp_path / "certs" / "ca.crt")


def running_pod(kube: Kube, namespace: str, job: str) -> dict:
    wait_phase(kube, namespace, job, "Running")
    pod = read_pod(kube, namespace, f"{job}-1")
    assert pod is not None
    return {"name": pod.metadata.name, "uid": pod.metadata.uid, "pod": pod}


def test_beats_to_the_leader_keep_an_attempt_running_and_write_nothing(
    kube: Kube, own_namespace: str, leader_beats: Beats
) -> None:
    create(kube, own_namespace, heartbeat_job("direct"))
    pod = running_pod(kube, own_namespace, "direct")
    spec = pod["pod"].spec
    env = {e.name: e.value for e in spec.containers[0].env}
    assert env["VIGIL_HEARTBEAT_URL"] == f"https://127.0.0.1:{leader_beats.port}/v1/heartbeat"
    assert "BEGIN CERTIFICATE" in env["VIGIL_HEARTBEAT_CA"]
    (volume,) = [v for v in spec.volumes if v.name == BEAT_TOKEN_VOLUME]
    assert volume.projected.sources[0].service_account_token.audience == "vigil.dev"

    token = pod_token(kube, own_namespace, pod, audiences=("vigil.dev",))
    stop = threading.Event()
    answers: list[int] = []

    def beat() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            answers.append(leader_beats.post(token, own_namespace, pod["name"], pod["uid"], f"{n}:direct")[0])
            stop.wait(1.0)

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        wait_until(lambda: answers and answers[-1] == 200, 10, "the first beat counted")
        version = read_pod(kube, own_namespace, pod["name"]).metadata.resource_version

        # Twice the timeout on beats to the leader alone: Running, one attempt, and the pod
        # never written (a beat by annotation would change its resourceVersion every second).
        def running_and_unwritten() -> None:
            current = status(kube, own_namespace, "direct")
            assert (current["phase"], current["attempts"]) == ("Running", 1), current
            assert read_pod(kube, own_namespace, pod["name"]).metadata.resource_version == version

        holds(running_and_unwritten, 12)
        assert set(answers) == {200}, answers
    finally:
        stop.set()
        beater.join()

    # The beats stop: silence is measured as it is for the annotation channel.
    wait_until(lambda: status(kube, own_namespace, "direct")["phase"] == "Uncertain", 10, "Uncertain after silence")


def test_forged_beats_are_refused_and_change_nothing(kube: Kube, own_namespace: str, leader_beats: Beats) -> None:
    create(kube, own_namespace, heartbeat_job("victim"))
    create(kube, own_namespace, heartbeat_job("mallory"))
    victim, mallory = running_pod(kube, own_namespace, "victim"), running_pod(kube, own_namespace, "mallory")
    mallory_token = pod_token(kube, own_namespace, mallory, audiences=("vigil.dev",))
    for_the_api_server = pod_token(kube, own_namespace, victim)  # the victim's own, but for another audience
    unbound = pod_token(kube, own_namespace, None, audiences=("vigil.dev",))  # the account's, no pod

    def forge_all() -> list[int]:
        return [
            leader_beats.post(mallory_token, own_namespace, victim["name"], victim["uid"])[0],
            leader_beats.post(mallory_token, own_namespace, victim["name"])[0],
            leader_beats.post(for_the_api_server, own_namespace, victim["name"], victim["uid"])[0],
            leader_beats.post(unbound, own_namespace, victim["name"], victim["uid"])[0],
            leader_beats.post("e30.e30.c2ln", own_namespace, victim["name"], victim["uid"])[0],
        ]

    assert forge_all() == [403, 403, 401, 401, 401]
    # Forgeries every second for the whole timeout and more, while Mallory beats for her own
    # pod with the same token: Mallory's attempt lives on, and the victim, which nothing
    # genuine beats for, goes Uncertain and is replaced as if the forgeries had never been sent.
    refused: list[list[int]] = []
    own: list[tuple[int, Any]] = []

    def round_() -> bool:
        own.append(leader_beats.post(mallory_token, own_namespace, mallory["name"], mallory["uid"]))
        refused.append(forge_all())
        return status(kube, own_namespace, "victim").get("attempts", 0) >= 2

    wait_until(round_, 30, "the unbeaten victim replaced despite the forged beats", interval=1.0)
    assert all(codes == [403, 403, 401, 401, 401] for codes in refused), refused
    assert all(beat == (200, {"state": "Renewed"}) for beat in own), own
    assert (status(kube, own_namespace, "mallory")["phase"], status(kube, own_namespace, "mallory")["attempts"]) == (
        "Running",
        1,
    )
