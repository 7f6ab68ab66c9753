"""A small fake leader of the pull protocol (docs/pull.md), served in-process over HTTPS: it hands
out the leases a test adds, holds a claim up to its waitSeconds while none is ready, records every
request (its body and token), every checkpoint and result, acknowledges results, cancels what a
test asks, and answers any other status on cue."""

from __future__ import annotations

import contextlib
import json
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.waits import wait_until

JOB_UID = "job-uid-1"


def lease_of(index: int, attempt: int = 1) -> tuple[str, int, int]:
    return (JOB_UID, index, attempt)


class FakeLeader:
    def __init__(self, certs: Path, *, beat: float = 0.2, lease: float = 30.0, max_hold: float = 2.0) -> None:
        self.beat, self.lease, self.max_hold = beat, lease, max_hold
        self.cond = threading.Condition()
        self.ready: list[dict[str, Any]] = []
        self.given: dict[tuple, dict[str, Any]] = {}
        self.results: dict[tuple, dict[str, Any]] = {}  # lease -> the first report of its result
        self.reports: list[tuple] = []  # every result sent, in order, resends too
        self.checkpoints: dict[tuple, list[str]] = {}
        self.cancelling: set[tuple] = set()
        self.requests: list[dict[str, Any]] = []  # each body, with "_token" and "_at" (monotonic) added
        self.status = 200  # anything else: answered so, with `retry_after`
        self.retry_after: str | None = None
        self.ack = True
        self.max_held = 0
        leader = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                status, answer, retry_after = leader.take(self.path, token, body)
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()
                self.wfile.write(raw)

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs / "tls.crt", certs / "tls.key")
        errors: list[BaseException | None] = []
        self.errors = errors

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                errors.append(sys.exc_info()[1])  # a worker's connection closed under a held claim, say

        self.http = Server(("127.0.0.1", 0), Handler)
        self.http.socket = context.wrap_socket(self.http.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.http.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}/v1/pull"
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        with self.cond:
            self.status = 599  # holds nothing any more
            self.cond.notify_all()
        self.http.shutdown()
        self.http.server_close()

    # --- what a test does ---------------------------------------------------------------------

    def add(self, index: int, *, item: Any = "", attempt: int = 1, grace: float = 1.0, checkpoint: str = "") -> tuple:
        lease = lease_of(index, attempt)
        env = {
            "VIGIL_JOB": "etl",
            "VIGIL_JOB_UID": JOB_UID,
            "VIGIL_ATTEMPT": str(attempt),
            "VIGIL_FENCING_TOKEN": str(attempt),
            "VIGIL_TASK_INDEX": str(index),
            "VIGIL_TASK_COUNT": "200",
            "VIGIL_TASK_ITEM": item if isinstance(item, str) else json.dumps(item),
            "VIGIL_IDEMPOTENCY_KEY": f"{JOB_UID}-{index}",
            "VIGIL_CHECKPOINT": checkpoint,
            "VIGIL_GUARANTEE": "AtLeastOnce",
        }
        grant = {
            "lease": list(lease),
            "job": "etl",
            "namespace": "team-a",
            "index": index,
            "attempt": attempt,
            "graceSeconds": grace,
            "deadlineSeconds": None,
            "env": env,
        }
        with self.cond:
            self.ready.append(grant)
            self.cond.notify_all()
        return lease

    def cancel(self, lease: tuple) -> None:
        with self.cond:
            self.cancelling.add(lease)

    def wait_for(self, condition, within: float = 20.0) -> Any:
        """Polls `condition()` (under the leader's lock) until it holds; fails after `within` s."""

        def held() -> Any:
            with self.cond:
                return condition()

        return wait_until(held, within, str(condition), interval=0.02)

    def held(self) -> set[tuple]:
        """What the last request said runs."""
        with self.cond:
            return {tuple(x) for x in self.requests[-1]["held"]} if self.requests else set()

    # --- the protocol --------------------------------------------------------------------------

    def take(self, path: str, token: str, body: dict[str, Any]) -> tuple[int, Any, str | None]:
        with self.cond:
            self.requests.append({**body, "_token": token, "_at": time.monotonic(), "_path": path})
            if self.status != 200:
                return self.status, {"message": "not now"}, self.retry_after
            self.max_held = max(self.max_held, len(body["held"]))
            for cp in body["checkpoints"]:
                self.checkpoints.setdefault(tuple(cp["lease"]), []).append(cp["value"])
            acked = []
            for result in body["results"]:
                lease = tuple(result["lease"])
                self.reports.append(lease)
                self.results.setdefault(lease, result)
                self.cancelling.discard(lease)
                acked.append(result["lease"])
            free, wait = body["free"], min(body["waitSeconds"], self.max_hold)
            end = time.monotonic() + wait
            while free and not self.ready and self.status == 200 and time.monotonic() < end:
                self.cond.wait(end - time.monotonic())
            leases = []
            while free and self.ready and self.status == 200:
                grant = self.ready.pop(0)
                self.given[tuple(grant["lease"])] = grant
                leases.append(grant)
                free -= 1
            answer = {
                "leases": leases,
                "cancel": [list(x) for x in sorted(self.cancelling)],
                "acked": acked if self.ack else [],
                "beatSeconds": self.beat,
                "leaseSeconds": self.lease,
            }
            return 200, answer, None


@contextlib.contextmanager
def leader(certs: Path, **kwargs: Any):
    fake = FakeLeader(certs, **kwargs)
    try:
        yield fake
    finally:
        fake.close()
