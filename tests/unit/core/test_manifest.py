"""The attempt pod: its deterministic name, and its manifest built from the job's template."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.builders import JOB_UID, make_job
from vigil import api
from vigil.core.manifest import (
    BEAT_TOKEN_DIR,
    BEAT_TOKEN_VOLUME,
    DEFAULT_CONTAINER,
    MAX_POD_NAME,
    SHARED_VOLUME,
    BeatChannel,
    attempt_pod_manifest,
    attempt_pod_name,
    resolved_agent,
)

pytestmark = pytest.mark.unit

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_a_short_name_is_job_dash_attempt() -> None:
    assert attempt_pod_name("reconcile-ledger", 3) == "reconcile-ledger-3"


def test_a_long_name_is_cut_and_hashed_to_63_characters() -> None:
    name = "a" * 70
    pod_name = attempt_pod_name(name, 12)
    assert len(pod_name) == MAX_POD_NAME
    assert pod_name.endswith("-12")
    assert pod_name == attempt_pod_name(name, 12)  # deterministic
    assert attempt_pod_name("a" * 69 + "b", 12) != pod_name  # same prefix, other job


def test_the_boundary_length_is_kept_as_is() -> None:
    name = "j" * (MAX_POD_NAME - 2)
    assert attempt_pod_name(name, 7) == f"{name}-7"
    assert attempt_pod_name(name, 10) != f"{name}-10"


@given(
    job_name=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,120}[a-z0-9])?", fullmatch=True),
    attempt=st.integers(1, 10**6),
)
def test_every_pod_name_is_a_dns_label_unique_per_attempt(job_name: str, attempt: int) -> None:
    name = attempt_pod_name(job_name, attempt)
    assert len(name) <= MAX_POD_NAME
    assert DNS_LABEL.match(name)
    assert name != attempt_pod_name(job_name, attempt + 1)


def manifest(template: dict | None = None, **job_kwargs: object) -> dict:
    job = make_job(**job_kwargs)
    if template is not None:
        job["spec"]["template"] = template
    return attempt_pod_manifest(api.VigilJob.model_validate(job), 4, '{"offset": 9}')


def unchecked(template: dict) -> api.VigilJob:
    """A job with a template its validation would refuse (the models are frozen and validated)."""
    job = api.VigilJob.model_validate(make_job())
    return job.model_copy(update={"spec": job.spec.model_copy(update={"template": template})})


def env_of(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_pod_is_named_labelled_and_owned_by_its_job() -> None:
    pod = manifest(spec={"queue": "batch"})
    meta = pod["metadata"]
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert meta["name"] == "ledger-4"
    assert meta["namespace"] == "work"
    assert meta["labels"] == {api.LABEL_JOB_UID: JOB_UID, api.LABEL_ATTEMPT: "4", api.LABEL_QUEUE: "batch"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "vigil.dev/v1beta1",
            "kind": "VigilJob",
            "name": "ledger",
            "uid": JOB_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pod["spec"]["restartPolicy"] == "Never"


def test_every_container_gets_the_vigil_environment() -> None:
    pod = manifest(spec={"heartbeat": {"intervalSeconds": 7, "timeoutSeconds": 30}})
    (container,) = pod["spec"]["containers"]
    assert env_of(container) == {
        "VIGIL_JOB": "ledger",
        "VIGIL_JOB_UID": JOB_UID,
        "VIGIL_ATTEMPT": "4",
        "VIGIL_FENCING_TOKEN": "4",
        "VIGIL_HEARTBEAT_INTERVAL": "7",
        "VIGIL_HEARTBEAT_TIMEOUT": "30",
        "VIGIL_GUARANTEE": "AtLeastOnce",
        "VIGIL_CHECKPOINT": '{"offset": 9}',
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }


def test_the_template_is_kept_as_given_apart_from_vigils_additions() -> None:
    template = {
        "metadata": {"labels": {"team": "ledger"}, "annotations": {"note": "x"}, "generateName": "nope-"},
        "spec": {
            "restartPolicy": "OnFailure",
            "nodeSelector": {"disk": "ssd"},
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [
                {"name": "main", "image": "app", "env": [{"name": "MODE", "value": "full"}]},
                {"name": "agent", "image": "vigil-agent", "env": [{"name": "VIGIL_ATTEMPT", "value": "99"}]},
            ],
        },
    }
    original = copy.deepcopy(template)
    pod = manifest(template)

    assert template == original  # the job's template is not mutated
    assert pod["metadata"]["labels"]["team"] == "ledger"
    assert pod["metadata"]["annotations"] == {"note": "x"}
    assert "generateName" not in pod["metadata"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    main, agent = pod["spec"]["containers"]
    assert main["env"][0] == {"name": "MODE", "value": "full"}
    assert env_of(agent)["VIGIL_ATTEMPT"] == "4"  # Vigil's value wins over the template's
    assert [e["name"] for e in agent["env"]].count("VIGIL_ATTEMPT") == 1
    assert env_of(pod["spec"]["initContainers"][0])["VIGIL_FENCING_TOKEN"] == "4"
    assert main["env"][1] is not agent["env"][0]  # no shared objects between containers


def test_vigils_labels_win_over_the_templates() -> None:
    # The API server refuses such a template; the builder does not rely on that.
    pod = attempt_pod_manifest(unchecked({"metadata": {"labels": {api.LABEL_ATTEMPT: "1"}}}), 4, None)
    assert pod["metadata"]["labels"][api.LABEL_ATTEMPT] == "4"


def test_every_pod_carries_the_attempt_tracking_finalizer() -> None:
    assert manifest()["metadata"]["finalizers"] == [api.FINALIZER_ATTEMPT_TRACKING]


def test_the_templates_finalizers_stay_beside_vigils() -> None:
    template = {"metadata": {"finalizers": ["example.com/audit"]}, "spec": {"containers": []}}
    pod = manifest(template)
    assert pod["metadata"]["finalizers"] == ["example.com/audit", api.FINALIZER_ATTEMPT_TRACKING]
    assert template["metadata"]["finalizers"] == ["example.com/audit"]  # not mutated


def test_vigils_finalizer_is_there_once_even_if_the_template_names_it() -> None:
    job = unchecked({"metadata": {"finalizers": [api.FINALIZER_ATTEMPT_TRACKING]}})  # refused at the door too
    assert attempt_pod_manifest(job, 1, None)["metadata"]["finalizers"] == [api.FINALIZER_ATTEMPT_TRACKING]


def test_no_checkpoint_is_an_empty_value() -> None:
    job = api.VigilJob.model_validate(make_job())
    pod = attempt_pod_manifest(job, 1, None)
    assert env_of(pod["spec"]["containers"][0])["VIGIL_CHECKPOINT"] == ""


def test_the_agent_learns_the_guarantee_and_timeout_it_fences_by() -> None:
    pod = manifest(spec={"guarantee": "NoOverlap", "heartbeat": {"intervalSeconds": 5, "timeoutSeconds": 45}})
    env = env_of(pod["spec"]["containers"][0])
    assert (env["VIGIL_GUARANTEE"], env["VIGIL_HEARTBEAT_TIMEOUT"]) == ("NoOverlap", "45")


# --- beats to the leader ---------------------------------------------------------------------------

CHANNEL = BeatChannel(
    "https://vigil-webhook.vigil-system.svc/v1/heartbeat", "-----BEGIN CERTIFICATE-----\n", "vigil.dev"
)


def beating(heartbeat: dict | None = None, template: dict | None = None) -> dict:
    job = make_job(spec={"heartbeat": heartbeat or {}})
    if template is not None:
        job["spec"]["template"] = template
    return attempt_pod_manifest(api.VigilJob.model_validate(job), 2, None, beat_channel=CHANNEL)


def test_with_the_leader_channel_every_container_gets_the_url_the_ca_and_its_own_projected_token() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [{"name": "main", "image": "app", "volumeMounts": [{"name": "data", "mountPath": "/d"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}],
        }
    }
    pod = beating(template=template)
    (token_volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == BEAT_TOKEN_VOLUME]
    assert token_volume["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": "vigil.dev", "expirationSeconds": 3600, "path": "token"}}
    ]
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"data", BEAT_TOKEN_VOLUME}
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        env = env_of(container)
        assert env["VIGIL_HEARTBEAT_URL"] == CHANNEL.url and env["VIGIL_HEARTBEAT_CA"] == CHANNEL.ca_pem
        assert env["VIGIL_HEARTBEAT_TOKEN_FILE"] == f"{BEAT_TOKEN_DIR}/token"
        assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
        assert {"name": BEAT_TOKEN_VOLUME, "mountPath": BEAT_TOKEN_DIR, "readOnly": True} in container["volumeMounts"]
    assert pod["spec"]["containers"][0]["volumeMounts"][0] == {"name": "data", "mountPath": "/d"}


def test_no_leader_channel_for_the_annotation_channel_or_without_an_agent() -> None:
    for heartbeat in ({"via": "Annotation"}, {"required": False}):
        pod = beating(heartbeat)
        assert "VIGIL_HEARTBEAT_URL" not in env_of(pod["spec"]["containers"][0])
        assert BEAT_TOKEN_VOLUME not in {v["name"] for v in pod["spec"].get("volumes") or []}
    plain = manifest()
    assert "VIGIL_HEARTBEAT_URL" not in env_of(plain["spec"]["containers"][0])


def test_a_template_cannot_swap_the_token_volume_or_the_url() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "main", "image": "app", "env": [{"name": "VIGIL_HEARTBEAT_URL", "value": "https://evil"}]}
            ],
            "volumes": [{"name": BEAT_TOKEN_VOLUME, "emptyDir": {}}],
        }
    }
    pod = beating(template=template)
    assert env_of(pod["spec"]["containers"][0])["VIGIL_HEARTBEAT_URL"] == CHANNEL.url
    assert [v for v in pod["spec"]["volumes"] if v["name"] == BEAT_TOKEN_VOLUME][0]["projected"]


# --- the injected agent (heartbeat.agent: Sidecar) -------------------------------------------------

AGENT_IMAGE = "registry.example/vigil:0.1.0"


def injected(
    heartbeat: dict | None = None, template: dict | None = None, agent_image: str | None = AGENT_IMAGE
) -> dict:
    job = make_job(spec={"heartbeat": heartbeat or {}})
    if template is not None:
        job["spec"]["template"] = template
    return attempt_pod_manifest(api.VigilJob.model_validate(job), 3, None, agent_image=agent_image)


def agent_of(pod: dict) -> dict | None:
    found = [c for c in pod["spec"].get("initContainers") or [] if c["name"] == api.AGENT_CONTAINER]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize(
    ("heartbeat", "agent_image", "expected"),
    [
        ({}, AGENT_IMAGE, "Sidecar"),  # unset: the operator's default, which knows an image
        ({}, None, "Image"),  # unset, and the operator knows no image: vigil-agent in the job's image
        ({"agent": "Image"}, AGENT_IMAGE, "Image"),
        ({"agent": "Sidecar"}, AGENT_IMAGE, "Sidecar"),
        ({"required": False}, AGENT_IMAGE, None),
        ({"required": False, "agent": "Sidecar"}, AGENT_IMAGE, None),
    ],
)
def test_who_beats_follows_the_field_then_the_operators_default(
    heartbeat: dict, agent_image: str | None, expected: str | None
) -> None:
    assert resolved_agent(api.Heartbeat.model_validate(heartbeat), agent_image) == expected
    pod = injected(heartbeat, agent_image=agent_image)
    assert (agent_of(pod) is not None) == (expected == "Sidecar")
    assert pod["spec"].get("shareProcessNamespace", False) == (expected == "Sidecar")


def test_sidecar_asked_for_without_an_agent_image_injects_nothing() -> None:
    pod = injected({"agent": "Sidecar"}, agent_image=None)
    assert agent_of(pod) is None and "shareProcessNamespace" not in pod["spec"]


def test_the_injected_agent_is_a_native_sidecar_last_among_the_init_containers() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [{"name": "main", "image": "app", "env": [{"name": "MINE", "value": "1"}]}],
        }
    }
    pod = injected({"startupGraceSeconds": 45}, template=template)
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["setup", api.AGENT_CONTAINER]
    agent = init[-1]
    assert agent["image"] == AGENT_IMAGE
    assert agent["restartPolicy"] == "Always"
    assert agent["command"] == ["vigil-agent", "--sidecar"]
    assert agent["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "96Mi"}}
    assert pod["spec"]["shareProcessNamespace"] is True
    main_env, agent_env = env_of(pod["spec"]["containers"][0]), env_of(agent)
    assert main_env["MINE"] == "1"  # the job keeps its own environment and Vigil's
    assert {k: v for k, v in agent_env.items() if k != "VIGIL_STARTUP_GRACE"} == {
        k: v for k, v in main_env.items() if k != "MINE"
    }
    assert agent_env["VIGIL_STARTUP_GRACE"] == "45"
    assert agent_env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_the_injected_agent_gets_the_leader_channel_and_its_token_like_the_job() -> None:
    job = api.VigilJob.model_validate(make_job())
    pod = attempt_pod_manifest(
        job, 1, None, beat_channel=BeatChannel("https://vigil-webhook/v1/heartbeat"), agent_image=AGENT_IMAGE
    )
    agent = agent_of(pod)
    assert agent is not None
    assert env_of(agent)["VIGIL_HEARTBEAT_URL"] == "https://vigil-webhook/v1/heartbeat"
    assert {"name": BEAT_TOKEN_VOLUME, "mountPath": BEAT_TOKEN_DIR, "readOnly": True} in agent["volumeMounts"]


def test_a_template_container_named_vigil_agent_is_kept_and_nothing_injected() -> None:
    template = {"spec": {"containers": [{"name": api.AGENT_CONTAINER, "image": "mine"}]}}
    pod = injected(template=template)
    assert [c["name"] for c in pod["spec"]["containers"]] == [api.AGENT_CONTAINER]
    assert "initContainers" not in pod["spec"] and "shareProcessNamespace" not in pod["spec"]


def test_a_liveness_file_mounts_one_shared_emptydir_in_every_container() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "setup", "image": "busybox"}],
            "containers": [{"name": "a", "image": "app"}, {"name": "b", "image": "app"}],
            "volumes": [{"name": SHARED_VOLUME, "hostPath": {"path": "/"}}],  # cannot swap Vigil's
        }
    }
    pod = injected({"livenessFile": "/var/run/vigil/alive", "livenessPort": 8099}, template=template)
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == SHARED_VOLUME]
    assert "emptyDir" in volume and "hostPath" not in volume
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        assert {"name": SHARED_VOLUME, "mountPath": api.LIVENESS_DIR} in container["volumeMounts"]
        env = env_of(container)
        assert env["VIGIL_LIVENESS_FILE"] == "/var/run/vigil/alive" and env["VIGIL_LIVENESS_PORT"] == "8099"


def test_every_injected_pod_shares_the_checkpoint_file_with_its_agent() -> None:
    pod = injected({"livenessPort": 8099})
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == SHARED_VOLUME]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}  # room for a 2 KiB checkpoint
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        assert {"name": SHARED_VOLUME, "mountPath": api.LIVENESS_DIR} in container["volumeMounts"]
        assert env_of(container)[api.ENV_CHECKPOINT_FILE] == api.CHECKPOINT_FILE
        assert "VIGIL_LIVENESS_FILE" not in env_of(container)


def test_without_the_injected_agent_nothing_is_shared() -> None:
    pod = injected({"agent": "Image"})
    assert SHARED_VOLUME not in {v["name"] for v in pod["spec"].get("volumes") or []}
    assert "volumeMounts" not in pod["spec"]["containers"][0]
    assert api.ENV_CHECKPOINT_FILE not in env_of(pod["spec"]["containers"][0])  # the agent sets its own


@pytest.mark.parametrize(
    ("pod_security", "runs_as_root_with_kill"),
    [
        (None, True),  # the job's image picks its UID: only root with CAP_KILL can signal it
        ({"fsGroup": 2000}, True),
        ({"runAsUser": 1000}, False),  # inherits the job's UID: no capability needed
        ({"runAsUser": 1000, "runAsNonRoot": True}, False),
        ({"runAsNonRoot": True}, False),  # root would keep the pod from starting
    ],
)
def test_the_agents_security_context_follows_the_pods(pod_security: dict | None, runs_as_root_with_kill: bool) -> None:
    template = {"spec": {"containers": [{"name": "main", "image": "app"}]}}
    if pod_security is not None:
        template["spec"]["securityContext"] = pod_security
    agent = agent_of(injected(template=template))
    assert agent is not None
    context = agent["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    if runs_as_root_with_kill:
        assert context["runAsUser"] == 0 and context["capabilities"]["add"] == ["KILL"]
    else:
        assert "runAsUser" not in context and "add" not in context["capabilities"]


def test_kubectl_logs_of_an_injected_pod_means_the_jobs_container() -> None:
    template = {"spec": {"containers": [{"name": "main", "image": "app"}, {"name": "side", "image": "app"}]}}
    pod = injected(template=template)
    assert pod["metadata"]["annotations"][DEFAULT_CONTAINER] == "main"
    template["metadata"] = {"annotations": {DEFAULT_CONTAINER: "side"}}
    assert injected(template=template)["metadata"]["annotations"][DEFAULT_CONTAINER] == "side"  # theirs
    assert DEFAULT_CONTAINER not in (injected({"agent": "Image"})["metadata"].get("annotations") or {})
