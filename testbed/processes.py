"""Where a test bed cluster lives and the processes it runs: its directory and ports (`Cluster`,
`Ports`), a process started in its own session and known by its pid file (`start`, `stop`,
`running_pid`, `wait_for`), and the checks that ask whether a component answers, with `kubectl`.
Standard library only, like the rest of testbed/.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("VIGIL_CACHE", Path.home() / ".cache" / "vigil"))
BIN = CACHE / "bin"


class ClusterError(RuntimeError):
    """A step of bringing the cluster up failed; the message says what to look at."""


def log(msg: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Ports:
    """All ports of one cluster, derived from one base so two clusters can run side by side."""

    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        return cls(base, base + 1, base + 2, base + 3, base + 4, base + 5)


@dataclass(frozen=True)
class Cluster:
    name: str
    ports: Ports

    @property
    def dir(self) -> Path:
        return CACHE / "clusters" / self.name

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def pids(self) -> Path:
        return self.dir / "pids"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log (JSON lines): one event per write, see AUDIT_POLICY."""
        return self.logs / "audit.log"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def save(self, durable: bool = False) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "cluster.json").write_text(
            json.dumps({"name": self.name, "port_base": self.ports.apiserver, "durable": durable})
        )

    @staticmethod
    def saved(name: str) -> dict:
        """What `up` recorded about the cluster `name` (empty when it never ran)."""
        path = CACHE / "clusters" / name / "cluster.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @classmethod
    def load(cls, name: str) -> Cluster | None:
        data = cls.saved(name)
        return cls(data["name"], Ports.from_base(data["port_base"])) if data else None


# --- binaries ---------------------------------------------------------------------------


def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        raise ClusterError(f"{path} is missing: run testbed/build.sh first (it builds the control plane).")
    return str(path)


# --- processes ------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is not running.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, a unique identity."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def running_pid(cluster: Cluster, component: str) -> int | None:
    """The pid of the component if the very process `start` launched still runs."""
    pidfile = cluster.pids / f"{component}.pid"
    if not pidfile.exists():
        return None
    pid, _, started = pidfile.read_text().partition(" ")
    # Guard against pid reuse: same pid and same start time, or it is another process.
    if not _pid_alive(int(pid)) or _start_time(int(pid)) != started.strip():
        return None
    return int(pid)


def start(cluster: Cluster, component: str, command: list[str], env: dict[str, str] | None = None) -> None:
    """Starts a process of the cluster in its own session, logging to logs/<component>.log."""
    if running_pid(cluster, component):
        log(f"{component}: already running")
        return
    cluster.logs.mkdir(parents=True, exist_ok=True)
    cluster.pids.mkdir(parents=True, exist_ok=True)
    logfile = cluster.logs / f"{component}.log"
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    (cluster.pids / f"{component}.pid").write_text(f"{proc.pid} {_start_time(proc.pid)}")
    log(f"{component}: started (pid {proc.pid}), log {logfile}")


def stop(cluster: Cluster, component: str, timeout: float = 15.0, sig: int = signal.SIGTERM) -> None:
    """Stops the component with `sig` (SIGKILL after `timeout`) and waits until it is gone."""
    pid = running_pid(cluster, component)
    pidfile = cluster.pids / f"{component}.pid"
    if pid:
        os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _pid_alive(pid):
                time.sleep(0.05)
        log(f"{component}: stopped (pid {pid})")
    pidfile.unlink(missing_ok=True)


def _wait_ports_free(ports: list[int], timeout: float = 15.0) -> None:
    """Waits until nothing listens on `ports` any more. A killed multi-threaded process shows as a
    zombie as soon as its main thread exits, while its other threads may still hold its sockets:
    starting its successor then would fail with "address already in use"."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise ClusterError(
                            f"port {port} is still in use {timeout:.0f}s after its process stopped"
                        ) from None
            time.sleep(0.05)


def wait_for(what: str, check, timeout: float, cluster: Cluster, component: str) -> None:
    """Polls check() until it is true; fails early if the component died, pointing at its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if component and not running_pid(cluster, component):
            tail = _tail(cluster.logs / f"{component}.log")
            raise ClusterError(f"{component} exited while waiting for {what}. Last log lines:\n{tail}")
        time.sleep(0.25)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; see {cluster.logs / (component + '.log')}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --- health checks --------------------------------------------------------------------------


def _admin_tls(cluster: Cluster) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
    ctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))
    return ctx


def _https_ok(cluster: Cluster, url: str) -> bool:
    try:
        with urllib.request.urlopen(url, context=_admin_tls(cluster), timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _get(cluster: Cluster, path: str) -> dict | None:
    """A GET of the API as admin, its JSON; None if it failed."""
    try:
        with urllib.request.urlopen(f"{cluster.server}{path}", context=_admin_tls(cluster), timeout=5) as resp:
            return json.load(resp)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _insecure_ok(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def kubectl(cluster: Cluster, *args: str, input: str | None = None) -> str:
    result = subprocess.run(
        [binary("kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args], input=input, capture_output=True, text=True
    )
    if result.returncode:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout
