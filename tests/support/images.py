"""Vigil's image as the tests run it: built by testbed/image.sh (podman, the repository's
Dockerfile), and run with podman as the chart runs it: on the host's network, as the numeric user
65532, a read-only root filesystem with a writable /tmp only (the chart's emptyDir), no
capabilities, no privilege escalation."""

from __future__ import annotations

import base64
import json
import resource
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from testbed import node
from testbed.cluster import ClusterError
from tests.support.cluster import ROOT, Kube
from tests.support.waits import deadline

# As testbed/image.sh runs podman here: runc (crun refuses a cgroup v1 hybrid machine) and ulimits
# this machine allows (podman's defaults exceed them).
PODMAN = ["podman", "--runtime", "runc"]
_files = resource.getrlimit(resource.RLIMIT_NOFILE)
LIMITS = ["--ulimit", f"nofile={_files[0]}:{_files[1]}", "--ulimit", "nproc=4096:4096"]
# The chart's securityContext and podSecurityContext (charts/vigil/values.yaml), and its /tmp.
AS_THE_CHART_RUNS_IT = [
    "--network", "host",
    "--user", "65532:65532",
    "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp",
    "--cap-drop", "all",
    "--security-opt", "no-new-privileges",
]  # fmt: skip
CONTAINER_PREFIX = "vigil-img-test"  # every container the suite runs is named so, and removed
KUBECONFIG_IN_CONTAINER = "/etc/vigil/kubeconfig"


def build_image() -> str:
    """testbed/image.sh: the image of the checkout as it is (built, or found already built); its
    name. Fails the test, with the script's words, when it cannot build or podman cannot run."""
    try:
        done = subprocess.run(
            [str(ROOT / "testbed" / "image.sh")], cwd=ROOT, capture_output=True, text=True, timeout=deadline(900)
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"testbed/image.sh did not finish within {deadline(900):g}s: {err.stderr!r}")
    if done.returncode:
        pytest.fail(f"testbed/image.sh could not build Vigil's image (exit {done.returncode}):\n{done.stderr}")
    print(done.stderr, end="", file=sys.__stderr__)  # built or up to date, and how long it took
    return done.stdout.strip().splitlines()[-1]


def podman(*args: str, timeout: float = 30, input: str | None = None) -> subprocess.CompletedProcess:
    """A podman command, at most deadline(timeout) seconds."""
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=deadline(timeout), input=input)


def run_args(
    image: str,
    name: str,
    command: Sequence[str],
    entrypoint: str | None = None,
    env: Mapping[str, str] | None = None,
    files: Mapping[Path, str] | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`run` arguments: the container `name` from `image` as the chart runs it, with `env` and
    host `files` mounted read-only at their paths in the container, and `extra` options."""
    args = ["run", "--name", name, "--pull=never", *LIMITS, *AS_THE_CHART_RUNS_IT, *extra]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    for host, inside in (files or {}).items():
        args += ["--volume", f"{host}:{inside}:ro"]
    if entrypoint:
        args += ["--entrypoint", entrypoint]
    return [*args, image, *command]


def run_once(
    image: str, name: str, command: Sequence[str], timeout: float = 60, **options
) -> subprocess.CompletedProcess:
    """The container to its end (removed after); its exit status is the command's."""
    try:
        return podman(*run_args(image, name, command, **options), timeout=timeout)
    finally:
        podman("rm", "--force", "--ignore", name)


class Container:
    """A long-running container (the operator), removed when the block ends; its log shown on the
    terminal if the block failed (CI keeps no files)."""

    def __init__(self, image: str, name: str, command: Sequence[str], **options):
        self.name = name
        self.args = run_args(image, name, command, **options)

    def __enter__(self) -> Container:
        podman("rm", "--force", "--ignore", self.name)  # a leftover of an interrupted run
        started = podman(*self.args[:1], "--detach", *self.args[1:])
        if started.returncode:
            pytest.fail(f"podman could not start {self.name}: {started.stderr}")
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None:
            print(f"--- {self.name}'s log", self.logs(), sep="\n", file=sys.__stderr__)
        podman("rm", "--force", "--time", "5", self.name)

    def running(self) -> bool:
        return self.state().get("Running") is True

    def state(self) -> dict:
        shown = podman("inspect", "--format", "{{json .State}}", self.name)
        return json.loads(shown.stdout) if shown.returncode == 0 else {}

    def logs(self) -> str:
        shown = podman("logs", self.name)
        return shown.stdout + shown.stderr

    def exit_code(self) -> int | None:
        """The exit status once the container has stopped, else None."""
        state = self.state()
        return int(state["ExitCode"]) if state.get("Status") in ("exited", "stopped") else None

    def stop(self, grace: float = 10) -> int:
        """SIGTERM, as the kubelet stops a pod, then SIGKILL after `grace` s; the exit status."""
        podman("stop", "--time", str(int(grace)), self.name, timeout=grace + 30)
        return int(self.state().get("ExitCode", -1))


def inline_kubeconfig(kube: Kube, path: Path, token: str | None = None) -> Path:
    """A kubeconfig for the cluster that holds its certificates itself (no paths of this host),
    for a container: the test's own identity, or a bearer `token`. Readable by the image's user."""
    if token is None:
        text = kube.kubectl("config", "view", "--flatten", "--minify", "--raw").stdout
    else:
        conf = kube.api.configuration
        ca = Path(conf.ssl_ca_cert).read_bytes()
        cluster = {"server": conf.host, "certificate-authority-data": base64.b64encode(ca).decode()}
        text = json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    path.write_text(text)
    path.chmod(0o644)  # the container runs as 65532; the directory around it stays the test's own
    return path


def plain_image() -> str:
    """testbed.node.plain_image: an image with no Python and nothing of Vigil (sleep, touch, mv,
    sed and sh), made once per content; its name. Fails the test when podman cannot make it."""
    try:
        return node.plain_image()
    except (ClusterError, OSError, subprocess.SubprocessError) as err:
        pytest.fail(f"podman could not make the plain image: {err}")
