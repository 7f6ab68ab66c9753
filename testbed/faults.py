"""Network faults on demand: a TCP proxy on loopback that can stall, partition, reset and delay.

Put it between a client (the operator, an agent, kubectl) and the kube-apiserver: it forwards
bytes untouched, so TLS passes through (the apiserver's certificate names IP 127.0.0.1, and a
port is not part of a certificate check).

    python -m testbed.faults proxy start --name op --listen 16500 --cluster default
    python -m testbed.faults stall --name op             # existing connections freeze half-open
    python -m testbed.faults partition --name op [--mode hang|refuse]
    python -m testbed.faults reset --name op             # RST every existing connection
    python -m testbed.faults delay 300 --name op         # +300 ms per chunk, each direction
    python -m testbed.faults heal --name op [--reset-stalled]
    python -m testbed.faults status [--name op]
    python -m testbed.faults stop --name op
    python -m testbed.faults signal STOP|CONT|KILL PID   # freeze, thaw or kill a process

A proxy is its own process (so a test and a person can drive the same one), controlled over a
loopback port written to $VIGIL_CACHE/faults/<name>/proxy.json beside its pid file and log.
Tests use the same thing from Python: `FaultProxy.start(...)`, `kubeconfig_via(...)`, and
`sigstop`/`sigcont`/`sigkill`/`frozen`. Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from testbed.processes import CACHE, Cluster, _pid_alive, _start_time, _tail

CHUNK = 64 * 1024
CONTROL_TIMEOUT = 10.0  # seconds for one control request, connect to answer
UPSTREAM_CONNECT_TIMEOUT = 10.0
ROOT = Path(__file__).resolve().parent.parent
PARTITION_MODES = ("hang", "refuse")


class FaultError(RuntimeError):
    """A proxy could not be started, reached or told what to do; the message says why."""


# --- the proxy (runs inside the proxy process) ---------------------------------------------------


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream twin.

    `gate` is set while bytes flow; cleared, both directions hold what they have read and pass
    nothing on (asyncio reads ahead up to 128 KiB, then the kernel buffers fill), so the peers
    see silence, never a close: not even a FIN or RST from the other side gets through.
    """

    id: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def stalled(self) -> bool:
        return not self.gate.is_set()

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]


def _rst(writer: asyncio.StreamWriter) -> None:
    """Closes with SO_LINGER 0, so the kernel sends RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Proxy:
    """The forwarding engine: one listener, its links, and the fault currently applied.

    Remembers the mode for new connections (`normal`, `partition-hang`, `partition-refuse`),
    the delay added to every chunk, and counters. Stalling is per link: `stall` freezes the
    links that exist now and leaves new ones alone.

    Waits on peers are unbounded on purpose: the proxy models a network, and a network waits as
    long as the endpoints do. Only the upstream connect has a timeout.
    """

    def __init__(self, listen: int, upstream: tuple[str, int]):
        self.port = listen  # 0 until bound: the kernel picks one
        self.upstream = upstream
        self.mode = "normal"
        self.delay = 0.0  # seconds
        self.links: dict[int, _Link] = {}
        self.accepted = 0
        self.resets = 0
        self._next_id = 0
        self._server: asyncio.Server | None = None

    async def listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._accept, sock=sock)

    def _unlisten(self) -> None:
        # Nothing listens on the port any more: a SYN gets RST, the client ECONNREFUSED.
        # Links already accepted are untouched (asyncio's Server.close leaves them open).
        if self._server is not None:
            self._server.close()
            self._server = None

    # faults ---------------------------------------------------------------------------------

    def stall(self) -> None:
        for link in self.links.values():
            link.gate.clear()

    async def partition(self, mode: str) -> None:
        if mode not in PARTITION_MODES:
            raise ValueError(f"partition mode must be one of {PARTITION_MODES}, not {mode!r}")
        self.stall()
        self.mode = f"partition-{mode}"
        if mode == "refuse":
            self._unlisten()
        elif self._server is None:
            await self.listen()

    async def reset(self, links: list[_Link] | None = None) -> int:
        victims = list(self.links.values()) if links is None else links
        for link in victims:
            for writer in link.writers():
                _rst(writer)
            for task in link.tasks:
                task.cancel()
            self.links.pop(link.id, None)
        self.resets += len(victims)
        await asyncio.sleep(0)  # transports close their sockets on the next loop turn
        return len(victims)

    def set_delay(self, ms: float) -> None:
        if ms < 0:
            raise ValueError("delay must be >= 0 ms")
        self.delay = ms / 1000

    async def heal(self, reset_stalled: bool = False) -> None:
        self.mode = "normal"
        self.delay = 0.0
        if self._server is None:
            await self.listen()
        stalled = [link for link in self.links.values() if link.stalled]
        if reset_stalled:
            await self.reset(stalled)
        else:
            for link in stalled:
                link.gate.set()  # what the link held flows on, as on a healed network

    async def close(self) -> None:
        self._unlisten()
        for link in list(self.links.values()):
            for writer in link.writers():
                writer.transport.abort()
            for task in link.tasks:
                task.cancel()
        self.links.clear()

    def status(self) -> dict:
        stalled = sum(link.stalled for link in self.links.values())
        return {
            "listen": self.port,
            "upstream": f"{self.upstream[0]}:{self.upstream[1]}",
            "listening": self._server is not None,
            "mode": self.mode,
            "delay_ms": round(self.delay * 1000),
            "connections": {"open": len(self.links), "stalled": stalled, "forwarding": len(self.links) - stalled},
            "accepted": self.accepted,
            "resets": self.resets,
        }

    # forwarding -----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._next_id += 1
        self.accepted += 1
        link = _Link(self._next_id, writer)
        if self.mode == "normal":
            link.gate.set()
        # Under partition-hang the client is accepted and hears nothing; the upstream does not
        # even see the connection until the partition heals (a blackholed route).
        self.links[link.id] = link
        link.tasks.append(asyncio.current_task())
        try:
            await link.gate.wait()
            try:
                up_reader, link.upstream = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream), UPSTREAM_CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError):
                _rst(writer)  # the upstream is down: the client sees its connection refused, late
                return
            directions = [
                asyncio.create_task(self._pump(link, reader, link.upstream)),
                asyncio.create_task(self._pump(link, up_reader, writer)),
            ]
            link.tasks.extend(directions)
            done, pending = await asyncio.wait(directions, return_when=asyncio.FIRST_EXCEPTION)
            broken = any(not t.cancelled() and t.exception() for t in done)
            for task in pending:
                task.cancel()
            await asyncio.gather(*directions, return_exceptions=True)
            for w in link.writers():
                # One side broke: break the other too, as a middlebox would. Else both sides
                # have half-closed and the sockets just close.
                if broken:
                    _rst(w)
                else:
                    w.close()
        except asyncio.CancelledError:
            pass  # reset() or close() took the link down and closed its sockets
        finally:
            self.links.pop(link.id, None)

    async def _pump(self, link: _Link, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Forwards one direction. Reading and writing are separate tasks so that a delay is
        latency (each chunk leaves `delay` after it arrived), not a throughput limit."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=64)

        async def read() -> None:
            while True:
                await link.gate.wait()
                data = await src.read(CHUNK)
                await queue.put((time.monotonic() + self.delay, data))
                if not data:
                    return

        async def write() -> None:
            while True:
                due, data = await queue.get()
                await link.gate.wait()
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                    await link.gate.wait()  # a stall may have begun during the delay
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()  # pass the half-close on
                    return
                dst.write(data)
                await dst.drain()

        tasks = [asyncio.create_task(read()), asyncio.create_task(write())]
        try:
            # Both end at EOF; either failing (a reset, a broken pipe) ends the direction.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception():
                    raise task.exception()
        finally:
            for task in tasks:
                task.cancel()


async def _serve(proxy: Proxy, name: str, state_dir: Path) -> None:
    """Runs a proxy and its control port until told to stop (a request or SIGTERM)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)

    async def control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = json.loads(await asyncio.wait_for(reader.readline(), CONTROL_TIMEOUT))
            op = request.get("op")
            if op == "stall":
                proxy.stall()
            elif op == "partition":
                await proxy.partition(request.get("mode", "hang"))
            elif op == "reset":
                await proxy.reset()
            elif op == "delay":
                proxy.set_delay(float(request["ms"]))
            elif op == "heal":
                await proxy.heal(bool(request.get("reset_stalled")))
            elif op == "stop":
                stopping.set()
            elif op != "status":
                raise ValueError(f"unknown operation {op!r}")
            answer = {"ok": True, "status": {"name": name, "pid": os.getpid(), **proxy.status()}}
            if op != "status":  # the log says when each fault began and ended
                c = answer["status"]["connections"]
                args = json.dumps({k: v for k, v in request.items() if k != "op"})
                print(
                    f"[{time.strftime('%H:%M:%S')}] {op} {args} -> mode {proxy.mode}, "
                    f"delay {answer['status']['delay_ms']} ms, {c['open']} open, {c['stalled']} stalled",
                    flush=True,
                )
        except (ValueError, KeyError, OSError, TimeoutError) as err:
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        with contextlib.suppress(OSError):
            writer.write(json.dumps(answer).encode() + b"\n")
            await asyncio.wait_for(writer.drain(), CONTROL_TIMEOUT)
            writer.close()

    state_dir.mkdir(parents=True, exist_ok=True)
    await proxy.listen()
    control_server = await asyncio.start_server(control, "127.0.0.1", 0)
    control_port = control_server.sockets[0].getsockname()[1]
    # The pid file carries the start time, as the cluster's do, so a reused pid is not taken
    # for this proxy; proxy.json says where it listens and is written last: it means "ready".
    pid = os.getpid()
    _write_atomic(state_dir / "proxy.pid", f"{pid} {_start_time(pid)}")
    _write_atomic(
        state_dir / "proxy.json",
        json.dumps({"pid": pid, "listen": proxy.port, "upstream": proxy.status()["upstream"], "control": control_port}),
    )
    print(f"proxy {name}: 127.0.0.1:{proxy.port} -> {proxy.status()['upstream']}, control port {control_port}")
    sys.stdout.flush()
    await stopping.wait()
    control_server.close()
    await proxy.close()
    (state_dir / "proxy.json").unlink(missing_ok=True)
    (state_dir / "proxy.pid").unlink(missing_ok=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# --- the handle tests and people use ---------------------------------------------------------------


def _parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise FaultError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def state_dir(name: str, home: Path | None = None) -> Path:
    """Where the proxy `name` keeps its pid file, control address and log."""
    return (home or CACHE) / "faults" / name


@dataclass(frozen=True)
class FaultProxy:
    """A running proxy process, identified by its pid file; every call is one control request.

    Each fault method returns the proxy's status after the fault took effect: bytes sent after
    `stall()` returns are held, connections made after `partition()` returns hang or are refused.
    """

    name: str
    dir: Path
    pid: int
    started: str  # the process's start time (clock ticks since boot): with the pid, its identity
    port: int  # where clients connect
    upstream: str
    control_port: int

    @classmethod
    def start(
        cls, name: str, listen: int, upstream: str, *, home: Path | None = None, timeout: float = 15.0
    ) -> FaultProxy:
        """Starts the proxy process (in its own session) and returns once it answers.

        `listen=0` lets the kernel choose the port (see `.port`). A proxy of this name that
        already runs with the same listen port and upstream is reused; another one is an error.
        """
        existing = cls.find(name, home=home)
        if existing:
            if existing.upstream == upstream and listen in (0, existing.port):
                return existing
            raise FaultError(
                f"proxy {name!r} already runs ({existing.port} -> {existing.upstream}); stop it or pick another name"
            )
        _parse_hostport(upstream)
        d = state_dir(name, home)
        d.mkdir(parents=True, exist_ok=True)
        (d / "proxy.json").unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "testbed.faults", "proxy", "run", "--name", name, "--listen", str(listen)]
        command += ["--upstream", upstream, "--state-dir", str(d)]
        with open(d / "proxy.log", "ab") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FaultError(f"proxy {name!r} exited ({proc.returncode}):\n{_tail(d / 'proxy.log')}")
            proxy = cls.find(name, home=home)
            if proxy:
                with contextlib.suppress(FaultError):
                    proxy.status()
                    return proxy
            time.sleep(0.05)
        proc.kill()
        raise FaultError(f"proxy {name!r} did not answer within {timeout}s; see {d / 'proxy.log'}")

    @classmethod
    def find(cls, name: str, *, home: Path | None = None) -> FaultProxy | None:
        """The running proxy of this name, or None (a stale pid file is not a proxy)."""
        d = state_dir(name, home)
        try:
            pid, _, started = (d / "proxy.pid").read_text().partition(" ")
            state = json.loads((d / "proxy.json").read_text())
        except (OSError, ValueError):
            return None
        # Same pid and same start time, or the pid was reused by another process.
        if int(pid) != state["pid"] or not _pid_alive(int(pid)) or _start_time(int(pid)) != started.strip():
            return None
        return cls(name, d, int(pid), started.strip(), state["listen"], state["upstream"], state["control"])

    @classmethod
    def all(cls, *, home: Path | None = None) -> list[FaultProxy]:
        root = (home or CACHE) / "faults"
        found = (cls.find(d.name, home=home) for d in sorted(root.iterdir())) if root.exists() else ()
        return [p for p in found if p]

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        """The API server's URL through this proxy (when the upstream is one)."""
        return f"https://127.0.0.1:{self.port}"

    def _request(self, op: str, **args) -> dict:
        try:
            with socket.create_connection(("127.0.0.1", self.control_port), timeout=CONTROL_TIMEOUT) as sock:
                sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
        except OSError as err:
            raise FaultError(f"proxy {self.name!r} (pid {self.pid}) does not answer: {err}") from err
        try:
            reply = json.loads(answer)
        except ValueError as err:
            raise FaultError(f"proxy {self.name!r} answered {answer[:200]!r}") from err
        if not reply["ok"]:
            raise FaultError(f"proxy {self.name!r}: {op} failed: {reply['error']}")
        return reply["status"]

    def status(self) -> dict:
        return self._request("status")

    def stall(self) -> dict:
        """Existing connections freeze half-open (nothing forwarded, nothing closed); new ones work."""
        return self._request("stall")

    def partition(self, mode: str = "hang") -> dict:
        """Existing connections stall; new ones are accepted and hang (`hang`) or refused (`refuse`)."""
        return self._request("partition", mode=mode)

    def reset(self) -> dict:
        """RST every existing connection, both sides. A one-shot: new connections work."""
        return self._request("reset")

    def delay(self, ms: float) -> dict:
        """Every chunk leaves `ms` after it arrived, in each direction (a round trip gains 2 x ms)."""
        return self._request("delay", ms=ms)

    def heal(self, reset_stalled: bool = False) -> dict:
        """No fault, no delay; stalled connections forward what they held (or are reset)."""
        return self._request("heal", reset_stalled=reset_stalled)

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the proxy process; its connections close. Safe to call twice."""
        if not self._alive():
            return
        with contextlib.suppress(FaultError):
            self._request("stop")
        deadline = time.monotonic() + timeout
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._alive():
            os.kill(self.pid, signal.SIGKILL)
        (self.dir / "proxy.pid").unlink(missing_ok=True)
        (self.dir / "proxy.json").unlink(missing_ok=True)

    def _alive(self) -> bool:
        return _pid_alive(self.pid) and _start_time(self.pid) == self.started

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def kubeconfig_via(proxy: FaultProxy, source: Path | str, path: Path | str) -> Path:
    """Writes a copy of the kubeconfig `source` whose current cluster is reached through `proxy`.

    Relative file paths in it are made absolute (they are relative to the source's folder).
    A server named by a host name keeps that name for the certificate check (tls-server-name).
    """
    source, path = Path(source), Path(path)
    text = source.read_text()
    try:
        config = json.loads(text)
    except ValueError:
        import yaml  # kubeconfigs written by other tools are YAML; pyyaml is in the project's venv

        config = yaml.safe_load(text)
    context_name = config.get("current-context")
    context = next((c["context"] for c in config.get("contexts", []) if c["name"] == context_name), None)
    if context is None:
        raise FaultError(f"{source}: no current context")
    for entry in config.get("clusters", []):
        if entry["name"] == context["cluster"]:
            cluster = entry["cluster"]
            url = urlsplit(cluster["server"])
            if url.hostname not in ("127.0.0.1", "::1") and "tls-server-name" not in cluster:
                cluster["tls-server-name"] = url.hostname
            cluster["server"] = urlunsplit(url._replace(netloc=f"127.0.0.1:{proxy.port}"))
    for section, keys in (
        ("clusters", ("certificate-authority",)),
        ("users", ("client-certificate", "client-key", "tokenFile")),
    ):
        for entry in config.get(section, []):
            inner = entry.get(section[:-1], {})
            for key in keys:
                if inner.get(key) and not Path(inner[key]).is_absolute():
                    inner[key] = str(source.parent / inner[key])
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML: every client reads it
    return path


# --- processes: freeze, thaw, kill ----------------------------------------------------------------


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return None


def _wait(pid: int, done, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise FaultError(f"pid {pid}: not {what} after {timeout}s (state {_state(pid)})")
        time.sleep(0.01)


def sigstop(pid: int, timeout: float = 5.0) -> None:
    """Freezes the process (SIGSTOP) and returns once the kernel shows it stopped: its sockets
    stay open and silent, like a machine that hangs."""
    os.kill(pid, signal.SIGSTOP)
    _wait(pid, lambda: _state(pid) in ("T", "t", None), "stopped", timeout)


def sigcont(pid: int, timeout: float = 5.0) -> None:
    """Thaws a process frozen by `sigstop`."""
    os.kill(pid, signal.SIGCONT)
    _wait(pid, lambda: _state(pid) not in ("T", "t"), "running again", timeout)


def sigkill(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL, and wait until it is dead (a zombie counts: reaping a child is the caller's job)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait(pid, lambda: not _pid_alive(pid), "dead", timeout)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """`with frozen(pid):` the process is stopped inside the block, and thawed however it ends."""
    sigstop(pid)
    try:
        yield
    finally:
        if _pid_alive(pid):
            sigcont(pid)


# --- command line ----------------------------------------------------------------------------------


def _print_status(status: dict) -> None:
    c = status["connections"]
    print(
        f"{status['name']}: 127.0.0.1:{status['listen']} -> {status['upstream']}  mode {status['mode']}"
        f"{'' if status['listening'] else ' (not listening)'}  delay {status['delay_ms']} ms  "
        f"connections {c['open']} open, {c['stalled']} stalled  (accepted {status['accepted']}, "
        f"reset {status['resets']}; pid {status['pid']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.faults", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def named(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--name", default="default", help="the proxy (default: default)")
        return p

    proxy = sub.add_parser("proxy", help="start a proxy (or run one in the foreground)")
    proxy.add_argument("action", choices=["start", "run"])
    proxy.add_argument("--name", default="default")
    proxy.add_argument("--listen", type=int, required=True, help="loopback port clients connect to (0: any)")
    target = proxy.add_mutually_exclusive_group(required=True)
    target.add_argument("--upstream", help="HOST:PORT to forward to")
    target.add_argument("--cluster", help="a test bed cluster: its apiserver, and a kubeconfig through the proxy")
    proxy.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)

    named("stall", "freeze existing connections half-open; new ones still work")
    partition = named("partition", "stall existing connections and hang or refuse new ones")
    partition.add_argument("--mode", choices=PARTITION_MODES, default="hang")
    named("reset", "RST every existing connection")
    delay = named("delay", "add latency to every chunk, each direction")
    delay.add_argument("ms", type=float)
    heal = named("heal", "back to normal; stalled connections resume")
    heal.add_argument("--reset-stalled", action="store_true", help="RST stalled connections instead")
    status = sub.add_parser("status", help="what a proxy (or each one) is doing")
    status.add_argument("--name")
    named("stop", "stop the proxy")
    sig = sub.add_parser("signal", help="SIGSTOP, SIGCONT or SIGKILL a process and wait for the effect")
    sig.add_argument("which", choices=["STOP", "CONT", "KILL"])
    sig.add_argument("pid", type=int)
    args = parser.parse_args(argv)

    try:
        if args.command == "signal":
            {"STOP": sigstop, "CONT": sigcont, "KILL": sigkill}[args.which](args.pid)
            return 0
        if args.command == "proxy":
            cluster = Cluster.load(args.cluster) if args.cluster else None
            if args.cluster and cluster is None:
                raise FaultError(f"no test bed cluster named {args.cluster!r}: python -m testbed.cluster up first")
            upstream = f"127.0.0.1:{cluster.ports.apiserver}" if cluster else args.upstream
            if args.action == "run":
                host, port = _parse_hostport(upstream)
                d = args.state_dir or state_dir(args.name)
                asyncio.run(_serve(Proxy(args.listen, (host, port)), args.name, d))
                return 0
            p = FaultProxy.start(args.name, args.listen, upstream)
            print(f"proxy {p.name}: 127.0.0.1:{p.port} -> {p.upstream} (pid {p.pid}, log {p.dir / 'proxy.log'})")
            if cluster:
                kubeconfig = kubeconfig_via(p, cluster.kubeconfig, p.dir / "kubeconfig")
                print(f"export KUBECONFIG={kubeconfig}")
            return 0
        if args.command == "status" and not args.name:
            proxies = FaultProxy.all()
            for p in proxies:
                _print_status(p.status())
            if not proxies:
                print("no proxy runs")
            return 0
        p = FaultProxy.find(args.name)
        if p is None:
            raise FaultError(f"no proxy named {args.name!r} runs (python -m testbed.faults proxy start ...)")
        if args.command == "stop":
            p.stop()
            print(f"proxy {p.name}: stopped")
            return 0
        calls = {
            "stall": p.stall,
            "partition": lambda: p.partition(args.mode),
            "reset": p.reset,
            "delay": lambda: p.delay(args.ms),
            "heal": lambda: p.heal(args.reset_stalled),
            "status": p.status,
        }
        _print_status(calls[args.command]())
    except (FaultError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
