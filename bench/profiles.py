"""Profiles of a run: py-spy sampling the operator (`Profiler`), and kube-apiserver's own CPU
profile in chunks (`ServerProfiler`), with the request handlers whose cost per write it reports."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bench.bed import Api

# kube-apiserver is profiled (--profile) in chunks of this many seconds, back to back over a run.
SERVER_PROFILE_CHUNK = 10


# Frames where a thread waits rather than works: on a loaded machine a thread that has just been
# woken is runnable (not idle to py-spy) while still on top of its wait, so these are left out.
WAITS = (
    "EpollSelector.select",
    "SSLSocket.read",  # the synchronous client waiting for the API server's answer
    "_worker (",  # a pool thread waiting for work
    "poll_wait_for_socket",
    "Condition.wait",
    "Event.wait",
    "Thread._wait_for_tstate_lock",
)


def py_spy() -> Path:
    """The py-spy beside this Python (the `bench` extra), or SystemExit saying how to install it:
    called when the arguments are read, not after a run's slow start."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        raise SystemExit(f"--profile needs py-spy, which is not at {spy}: pip install -e '.[bench]'")
    return spy


class Profiler:
    """py-spy (the `bench` extra) sampling the operator for the run; `top` reads its stacks."""

    def __init__(self, pid: int, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        spy = py_spy()
        self.proc = subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--rate", "100", "--function", "--nonblocking"]
            + ["--format", "raw", "--output", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.proc.send_signal(2)  # SIGINT: py-spy writes what it sampled and exits
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def top(self, count: int) -> dict[str, list[tuple[str, float]]]:
        """The functions with the most samples, as shares of every sample of a working thread: `self`
        (on top of the stack, any code) and `total` (anywhere in it, Vigil's own functions)."""
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        total = 0
        if not self.path.exists():
            return {"self": [], "total": []}
        for line in self.path.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            if not stack or not samples.isdigit():
                continue
            n = int(samples)
            frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
            if not frames or frames[-1].startswith(WAITS):
                continue
            total += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for frame in set(frames):
                if "vigil/" in frame:  # where in Vigil's own code the time goes
                    inclusive[frame] = inclusive.get(frame, 0) + n

        def best(table: dict[str, int]) -> list[tuple[str, float]]:
            ranked = sorted(table.items(), key=lambda kv: -kv[1])[:count]
            return [(frame, round(n / total, 4)) for frame, n in ranked]

        return {"samples": total, "self": best(own), "total": best(inclusive)}


class ServerProfiler(threading.Thread):
    """CPU profiles of kube-apiserver (Go's pprof, /debug/pprof/profile) back to back, in chunks
    of SERVER_PROFILE_CHUNK seconds, from the start of a run until the chunk running when it is
    stopped ends; merged into one profile at `path` (the run's window, give or take a chunk). The
    bench's own bed serves pprof when it runs with VIGIL_APISERVER_PROFILING=1."""

    def __init__(self, api: Api, path: Path):
        super().__init__(daemon=True)
        self.api, self.path = api, path
        self.halt = threading.Event()
        self.chunks: list[Path] = []
        self.error: str | None = None
        self.seconds = 0.0

    def run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while not self.halt.is_set():
            try:
                data = self.api.get(
                    f"/debug/pprof/profile?seconds={SERVER_PROFILE_CHUNK}", timeout=SERVER_PROFILE_CHUNK + 30
                )
            except Exception as err:  # noqa: BLE001 - reported with the results, the run goes on
                self.error = f"no API server profile ({err}); the bed must run with VIGIL_APISERVER_PROFILING=1"
                return
            chunk = self.path.with_suffix(f".{len(self.chunks)}.pprof")
            chunk.write_bytes(data)
            self.chunks.append(chunk)
            self.seconds += SERVER_PROFILE_CHUNK

    def stop(self) -> None:
        self.halt.set()
        self.join(SERVER_PROFILE_CHUNK + 60)
        if self.chunks:
            merged = subprocess.run(
                ["go", "tool", "pprof", "-proto", *map(str, self.chunks)], capture_output=True, check=False
            )
            if merged.returncode == 0:
                self.path.write_bytes(merged.stdout)
                for chunk in self.chunks:
                    chunk.unlink()
            else:
                self.error = f"go tool pprof could not merge the profiles: {merged.stderr.decode()[:200]}"

    def summary(self, count: int = 12) -> dict[str, Any]:
        """The profile's CPU seconds, its top functions by cumulative time (callees included), and
        the CPU seconds of each request handler in SERVER_HANDLERS (what one kind of write costs
        the server, divided by the count of those writes in the report)."""
        if self.error or not self.path.exists():
            return {"error": self.error or "no profile written"}
        text = subprocess.run(
            ["go", "tool", "pprof", "-top", "-cum", "-nodecount=5000", str(self.path)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        out: dict[str, Any] = {"file": str(self.path), "seconds": self.seconds, "cum": [], "handlers": {}}
        for line in text.splitlines():
            total = re.search(r"Total samples = ([\d.]+)(m?s)", line)
            if total:
                out["cpu_seconds"] = float(total.group(1)) / (1000 if total.group(2) == "ms" else 1)
            parts = line.split()
            if len(parts) < 6 or not parts[4].endswith("%"):
                continue
            function = " ".join(parts[5:])
            if len(out["cum"]) < count:
                out["cum"].append((function, float(parts[4].rstrip("%")) / 100))
            for request, handler in SERVER_HANDLERS.items():
                if handler == function:
                    seconds = re.fullmatch(r"([\d.]+)(m?s)", parts[3])
                    if seconds:
                        out["handlers"][request] = float(seconds.group(1)) / (1000 if seconds.group(2) == "ms" else 1)
        return out


# The server-side functions that carry out one kind of write, whole (decode, admission, validation,
# managed fields, the etcd round trip, encoding), for the profile's cost per write.
SERVER_HANDLERS = {
    "PATCH vigiljobs/status": "k8s.io/apiextensions-apiserver/pkg/registry/customresource.(*StatusREST).Update",
    "PUT jobs/status": "k8s.io/kubernetes/pkg/registry/batch/job/storage.(*StatusREST).Update",
    "PATCH pods/status": "k8s.io/kubernetes/pkg/registry/core/pod/storage.(*StatusREST).Update",
}
