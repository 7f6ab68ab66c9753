"""What the chart's webhook Service does for beats, on loopback: one address whose every new
connection goes to the operator that leads now (the Service selects the leader's pod by the
label the leader puts on it; here the Lease's holder is asked, as often as a connection comes).

A connection to a process that died is reset by the kernel, and one to a standby gets its 503:
either way the agent falls back to the annotation for that beat and opens a new connection for
the next, as it would through a Service whose endpoints had not changed yet.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class LeaderService:
    """A TCP forwarder on 127.0.0.1:`port`; `upstream()` names the port of whoever leads (None:
    nobody, the connection is closed at once)."""

    def __init__(self, upstream: Callable[[], int | None]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: dict[int, int] = {}  # upstream port -> connections sent there
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            port = self.upstream()
        except Exception:  # the Lease could not be read: as a Service without endpoints
            port = None
        if port is None:
            client.close()
            return
        try:
            server = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        with self._lock:
            self.connections[port] = self.connections.get(port, 0) + 1
            self._open += [client, server]
        threading.Thread(target=_pump, args=(server, client), daemon=True).start()
        _pump(client, server)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
