"""The fault proxy, process and all, between a client and a loopback echo server.

Each fault is checked from both ends: what the client sees (silence, refusal, reset, latency)
and what the upstream sees (nothing closed, no new connection, a reset).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.faults import FaultError, FaultProxy, frozen, kubeconfig_via, sigcont, sigkill, sigstop
from tests.support.waits import deadline, wait_until

pytestmark = pytest.mark.unit

# How long a stalled connection must stay silent to count as stalled. A bounded fixed window
# is the point of such a check (nothing must happen), so it is the one wait that is not a poll.
SILENCE = 0.5
# Real sockets and a proxy process: no clock to fake. Every wait for something is bounded by
# this, which only a hang reaches (everything here takes milliseconds); no assertion is an upper
# bound on speed but the delay test's, which is the least a throughput limit would take.
DEADLINE = deadline(30.0)


class EchoServer:
    """Echoes every byte back on its own threads, and counts what its connections saw."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = self.eofs = self.resets = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._serve, daemon=True)]
        self._threads[0].start()

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(0.1)  # short, so the thread notices close()
            self._count("accepted")
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except ConnectionResetError:
                    self._count("resets")
                    return
                if not data:
                    self._count("eofs")
                    return  # closing sends our FIN back
                conn.sendall(data)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=DEADLINE)
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def proxy(echo: EchoServer, tmp_path: Path) -> Iterator[FaultProxy]:
    p = FaultProxy.start("unit", 0, f"127.0.0.1:{echo.port}", home=tmp_path)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def connect(proxy: FaultProxy) -> Iterator[Callable[[], socket.socket]]:
    """Opens client connections to the proxy; closes them all afterwards."""
    opened: list[socket.socket] = []

    def open_one() -> socket.socket:
        sock = socket.create_connection(proxy.address, timeout=DEADLINE)
        opened.append(sock)
        return sock

    try:
        yield open_one
    finally:
        for sock in opened:
            sock.close()


def recv_exactly(sock: socket.socket, n: int, timeout: float = DEADLINE) -> bytes:
    deadline = time.monotonic() + timeout
    data = b""
    while len(data) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(n - len(data))
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    return data


def roundtrip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    return recv_exactly(sock, len(data))


def assert_silent(*socks: socket.socket, seconds: float = SILENCE) -> None:
    """Nothing arrives on any of them for `seconds`: no data, no EOF, no reset."""
    readable, _, errored = select.select(socks, [], socks, seconds)
    assert not readable and not errored, "a stalled connection was not silent"


def test_forwards_both_ways_and_passes_half_close_on(proxy, connect, echo):
    sock = connect()
    assert roundtrip(sock, b"x" * 200_000) == b"x" * 200_000
    assert proxy.status()["connections"] == {"open": 1, "stalled": 0, "forwarding": 1}
    sock.shutdown(socket.SHUT_WR)
    # The echo server sees our FIN and closes; its FIN comes back through the proxy.
    sock.settimeout(DEADLINE)
    assert sock.recv(10) == b""
    assert echo.eofs == 1
    wait_until(lambda: proxy.status()["connections"]["open"] == 0, 30, "the proxy to drop the closed link", 0.01)


def test_stall_freezes_existing_connections_while_new_ones_work(proxy, connect, echo):
    old = connect()
    assert roundtrip(old) == b"ping"
    status = proxy.stall()
    assert status["connections"] == {"open": 1, "stalled": 1, "forwarding": 0}

    old.sendall(b"held")
    assert_silent(old)
    new = connect()
    assert roundtrip(new) == b"ping"
    assert proxy.status()["connections"] == {"open": 2, "stalled": 1, "forwarding": 1}
    assert (echo.eofs, echo.resets) == (0, 0), "a stall closes nothing"

    proxy.heal()
    assert recv_exactly(old, 4) == b"held", "a healed link delivers what it held"
    assert roundtrip(old) == b"ping"


def test_heal_can_reset_the_stalled_connections_instead(proxy, connect):
    old = connect()
    assert roundtrip(old) == b"ping"
    proxy.stall()
    new = connect()
    assert roundtrip(new) == b"ping"
    status = proxy.heal(reset_stalled=True)
    assert status["connections"] == {"open": 1, "stalled": 0, "forwarding": 1}
    old.settimeout(DEADLINE)
    with pytest.raises(ConnectionResetError):
        old.recv(10)
    assert roundtrip(new) == b"ping"


def test_partition_hang_accepts_new_connections_that_hear_nothing(proxy, connect, echo):
    old = connect()
    assert roundtrip(old) == b"ping"
    assert proxy.partition()["mode"] == "partition-hang"
    hung = connect()  # the handshake completes: the client cannot tell it is cut off
    old.sendall(b"old!")
    hung.sendall(b"new!")
    assert_silent(old, hung)
    assert echo.accepted == 1, "the upstream never sees a connection made during the partition"

    assert proxy.heal()["mode"] == "normal"
    assert recv_exactly(old, 4) == b"old!"
    assert recv_exactly(hung, 4) == b"new!"
    assert echo.accepted == 2


def test_partition_refuse_refuses_new_connections(proxy, connect, echo):
    old = connect()
    assert roundtrip(old) == b"ping"
    status = proxy.partition("refuse")
    assert (status["mode"], status["listening"]) == ("partition-refuse", False)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=DEADLINE).close()
    old.sendall(b"old!")
    assert_silent(old)

    assert proxy.heal()["listening"]
    assert roundtrip(connect()) == b"ping"
    assert recv_exactly(old, 4) == b"old!"


def test_reset_breaks_both_sides_of_every_connection(proxy, connect, echo):
    socks = [connect(), connect()]
    for sock in socks:
        assert roundtrip(sock) == b"ping"
    status = proxy.reset()
    assert (status["connections"]["open"], status["resets"]) == (0, 2)
    for sock in socks:
        sock.settimeout(DEADLINE)
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
    wait_until(lambda: echo.resets == 2, 30, "the upstream to see both resets", 0.01)
    assert roundtrip(connect()) == b"ping", "a reset is one-shot: new connections work"


def test_delay_is_latency_on_each_chunk_not_a_throughput_limit(proxy, connect):
    sock = connect()
    assert roundtrip(sock) == b"ping"
    delay = 0.2  # each way
    assert proxy.delay(200)["delay_ms"] == 200

    began = time.monotonic()
    assert roundtrip(sock) == b"ping"
    assert time.monotonic() - began >= 2 * delay, "200 ms each way"

    # Ten chunks 20 ms apart arrive 400 ms after each was sent (about 0.6 s for the last), not
    # 200 ms after each other. A proxy that delayed chunk after chunk would hold the last one at
    # least (10 + 1) x 200 ms: ten delays in a row on the way in, one on the way back. That least
    # is the bound, not a guess at this machine's speed: a loaded one has 1.6 s to spare.
    chunks = 10
    began = time.monotonic()
    for i in range(chunks):
        sock.sendall(b"%d" % i)
        time.sleep(0.02)  # pacing, so the chunks stay separate; not a wait for anything
    assert recv_exactly(sock, chunks) == b"0123456789"
    assert 2 * delay <= time.monotonic() - began < (chunks + 1) * delay

    # Healed: no delay. Every roundtrip through a delayed proxy takes 400 ms at least; the
    # fastest of three here must take less (load could slow one, not all three by that much).
    assert proxy.heal()["delay_ms"] == 0
    fastest = float("inf")
    for _ in range(3):
        began = time.monotonic()
        assert roundtrip(sock) == b"ping"
        fastest = min(fastest, time.monotonic() - began)
    assert fastest < 2 * delay, fastest


def test_stop_closes_connections_and_the_port(tmp_path, echo):
    proxy = FaultProxy.start("stopping", 0, f"127.0.0.1:{echo.port}", home=tmp_path)
    try:
        sock = socket.create_connection(proxy.address, timeout=DEADLINE)
        assert roundtrip(sock) == b"ping"
        assert FaultProxy.find("stopping", home=tmp_path) == proxy
        proxy.stop()
        sock.settimeout(DEADLINE)
        assert sock.recv(10) == b""
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(proxy.address, timeout=DEADLINE).close()
        assert FaultProxy.find("stopping", home=tmp_path) is None
    finally:
        proxy.stop()


def test_command_line_drives_a_running_proxy(proxy, connect, tmp_path):
    def cli(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "testbed.faults", *args, "--name", "unit"],
            env={**os.environ, "VIGIL_CACHE": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert roundtrip(connect()) == b"ping"
    assert "mode normal" in cli("stall") and "1 stalled" in cli("status")
    assert "mode partition-refuse (not listening)" in cli("partition", "--mode", "refuse")
    assert "delay 250 ms" in cli("delay", "250")
    assert "mode normal  delay 0 ms  connections 0 open" in cli("heal", "--reset-stalled")


def test_refuses_what_it_cannot_do(proxy, echo, tmp_path):
    with pytest.raises(FaultError, match="partition mode"):
        proxy.partition("sideways")
    with pytest.raises(FaultError, match="already runs"):
        FaultProxy.start("unit", 0, "127.0.0.1:1", home=tmp_path)
    assert FaultProxy.start("unit", proxy.port, proxy.upstream, home=tmp_path) == proxy, "the same proxy is reused"


def test_kubeconfig_via_points_the_current_cluster_at_the_proxy(proxy, tmp_path):
    source_dir = tmp_path / "kube"
    source_dir.mkdir()
    source = source_dir / "config"
    source.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters:\n- name: k\n  cluster: {server: 'https://localhost:6443', certificate-authority: ca.crt}\n"
        "users:\n- name: u\n  user: {client-certificate: /abs/u.crt, client-key: u.key}\n"
        "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
    )
    config = json.loads(kubeconfig_via(proxy, source, tmp_path / "via").read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    assert cluster["server"] == f"https://127.0.0.1:{proxy.port}" == proxy.url
    assert cluster["tls-server-name"] == "localhost", "the certificate is still checked against the real name"
    assert cluster["certificate-authority"] == str(source_dir / "ca.crt")
    assert (user["client-certificate"], user["client-key"]) == ("/abs/u.crt", str(source_dir / "u.key"))


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1][0]


def test_process_helpers_freeze_thaw_and_kill():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        sigstop(proc.pid)
        assert _proc_state(proc.pid) == "T"
        sigcont(proc.pid)
        # Thawed is anything but stopped: under load a fresh `sleep` may still be paging in (D).
        assert _proc_state(proc.pid) not in "Tt"
        with frozen(proc.pid):
            assert _proc_state(proc.pid) == "T"
        assert _proc_state(proc.pid) not in "Tt"
        sigkill(proc.pid)
        assert proc.wait(timeout=DEADLINE) == -9
    finally:
        proc.kill()
        proc.wait(timeout=DEADLINE)
