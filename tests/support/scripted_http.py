"""A scripted HTTP/1.1 server on a thread, plain or TLS: the edges of the agent's own blocking
client (vigil.agent.transport), which no real server would show on cue."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path


class Request:
    def __init__(self, connection: int, head: bytes, body: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self.connection, self.line, self.body = connection, lines[0], body
        self.headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}


class Server:
    """An HTTP/1.1 server on a thread (TLS with `certs`): for the n-th request over all its
    connections, `script(n)` gives the bytes to send (or a list of pieces, sent `pause` seconds
    apart) and whether to close the connection then."""

    def __init__(self, script, certs: Path | None = None, pause: float = 0.0) -> None:
        self.script, self.pause = script, pause
        self.ctx = None
        if certs is not None:
            self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ctx.load_cert_chain(certs / "tls.crt", certs / "tls.key")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[Request] = []
        self.connections = 0
        self.open: list[socket.socket] = []
        self.halt = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def host(self) -> str:
        return f"{'https' if self.ctx else 'http'}://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.halt.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(raw, self.connections), daemon=True).start()

    def _serve(self, raw: socket.socket, number: int) -> None:
        with contextlib.suppress(OSError):
            conn = self.ctx.wrap_socket(raw, server_side=True) if self.ctx else raw
            self.open.append(conn)
            with conn:
                buffer = b""
                while not self.halt.is_set():
                    while b"\r\n\r\n" not in buffer:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        buffer += chunk
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    request = Request(number, head, b"")
                    length = int(request.headers.get("content-length", "0"))
                    while len(buffer) < length:
                        buffer += conn.recv(65536)
                    request.body, buffer = buffer[:length], buffer[length:]
                    self.requests.append(request)
                    reply, close = self.script(len(self.requests))
                    for piece in reply if isinstance(reply, list) else [reply] if reply else []:
                        conn.sendall(piece)
                        if self.pause:
                            self.halt.wait(self.pause)
                    if close:
                        return

    def stop(self) -> None:
        self.halt.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread: close alone would not
        self.listener.close()
        for conn in self.open:
            with contextlib.suppress(OSError):
                conn.close()


@contextlib.contextmanager
def server(script, certs: Path | None = None, pause: float = 0.0):
    s = Server(script, certs, pause)
    try:
        yield s
    finally:
        s.stop()
