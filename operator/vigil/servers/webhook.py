"""The admission webhook's shell: an HTTPS server (aiohttp) that answers AdmissionReviews with
`vigil.core.admission`, plus what it takes to run one: a self-signed certificate for local use
and the ValidatingWebhookConfiguration that points the API server at it.

The decisions (stateless answers, failurePolicy Ignore, timeout 5 s, the overshoot bound, the
limits below, the certificate and its rotation) are argued in docs/admission.md.

It runs in the operator's only event loop, the one that renews the Lease, runs the watches and
answers /healthz, so `lookup` reads the operator's cache directly, and nothing a caller sends may
hold that loop: anyone who can reach the port can post to it. So a body is capped
(MAX_REQUEST_BYTES), must arrive within READ_SECONDS, and reviews in flight are capped (the
excess is answered 503 at once); a small body is decoded on the loop (at most ~5 ms), a larger one
in a child process (`Skimmer`), since a decoder holds the GIL and a thread would not free the
loop. Every malformed review is a 4xx saying what is wrong. The certificate files are re-read
when they change (a renewed Secret, mounted by the kubelet, or cert-manager's renewal), so a
rotation needs no restart.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from vigil import api
from vigil.core import admission
from vigil.core.reviewbody import NotJson, skim
from vigil.runtime.clock import SYSTEM, Clock
from vigil.servers import skim_child
from vigil.servers.http import Bounds, Server, serve, split_address
from vigil.servers.tls import RELOAD_SECONDS, ServingCertificate

log = logging.getLogger(__name__)

PATH = "/validate-vigiljob"
WEBHOOK_NAME = "maxqueued.vigil.dev"  # the webhook's name inside the configuration (API errors cite it)
FAILURE_POLICY = "Ignore"  # docs/admission.md: durable submission over an exact cap
TIMEOUT_SECONDS = 5
# The API server takes request bodies up to 3 MiB and etcd stores objects up to 1.5 MiB: a
# review of a create over 3 MiB carries a job etcd would refuse anyway, so refusing the review
# (413, admitted by failurePolicy Ignore, then refused by etcd) changes no outcome.
MAX_REQUEST_BYTES = 3 * 1024 * 1024
# Bodies up to this size are decoded on the loop: the worst JSON of 32 KiB (tiny objects) takes
# ~5 ms there on the 2-core bed; an ordinary job's review is a few KiB. Larger ones go to the child.
INLINE_BYTES = 32 * 1024
READ_SECONDS = 2.0  # for the whole body to arrive: the API server sends it at once, and waits 5 s
PARSE_SECONDS = 3.0  # for the child to decode one (a hostile 3 MiB body takes ~0.5 s on the bed)
MAX_SMALL_IN_FLIGHT = 32  # reviews of bodies up to INLINE_BYTES being read or answered at once
MAX_LARGE_IN_FLIGHT = 2  # larger (or of unknown length): one decoding in the child, one next in line
# The API server's calls: a few connections of each of its replicas, more under a burst of
# creates (one per review in flight); a server past this many is under attack, not load.
BOUNDS = Bounds(max_connections=512, per_source=256, per_source_rate=100.0)


class Skimmer:
    """A child process (`vigil.servers.skim_child`) that decodes large review bodies off the
    event loop and sends back only the fields admission reads. One body at a time; started on
    first use, and again after it dies or overruns PARSE_SECONDS (then it is killed)."""

    def __init__(self, timeout: float = PARSE_SECONDS) -> None:
        self.timeout = timeout
        self.started = 0  # children started, for the tests and the log
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def skim(self, body: bytes) -> Any:
        """What `vigil.core.reviewbody.skim(body)` returns, computed in the child; raises NotJson
        as it does, and SkimFailed when the child could not answer."""
        async with self._lock:
            try:
                proc = await self._running()  # OSError if it cannot be started (no memory, no PIDs left)
                assert proc.stdin is not None and proc.stdout is not None
                async with asyncio.timeout(self.timeout):
                    proc.stdin.write(skim_child.HEADER.pack(len(body)))
                    proc.stdin.write(body)
                    await proc.stdin.drain()
                    (size,) = skim_child.HEADER.unpack(await proc.stdout.readexactly(skim_child.HEADER.size))
                    if size > MAX_REQUEST_BYTES:
                        raise ValueError(f"an answer of {size} bytes")
                    answer = json.loads(await proc.stdout.readexactly(size))
                    if not isinstance(answer, dict) or not ("error" in answer or "fields" in answer):
                        raise ValueError(f"an answer that is no frame of skim_child's: {str(answer)[:80]}")
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as err:
                self._kill()
                reason = f"took over {self.timeout:g} s" if isinstance(err, TimeoutError) else f"failed ({err!r})"
                raise SkimFailed(f"decoding the review {reason}") from None
            except BaseException:  # cancelled mid-frame: the pipe is out of step, so the child goes
                self._kill()
                raise
        if "error" in answer:
            raise NotJson(answer["error"])
        return answer["fields"]

    async def _running(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", skim_child.__name__, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            self.started += 1
            if self.started > 1:
                log.warning("admission webhook: restarted its parsing child (%d starts)", self.started)
        return self._proc

    def _kill(self) -> None:
        """Kills the child (asyncio reaps it); the next body starts another."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()

    async def close(self) -> None:
        """Ends the child: its input closes and it exits; killed if it does not at once."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 2)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class SkimFailed(Exception):
    """The parsing child died or overran its deadline: the review is answered 503."""


class WebhookServer:
    """POST /validate-vigiljob over HTTPS: AdmissionReview v1 in, AdmissionReview v1 out.

    lookup: (namespace, queue) -> (the queue's spec or None, tasks of it waiting now: plain jobs
        waiting to start and arrays' tasks not started), from the operator's cache, without I/O.
        A create is refused when those and the tasks it adds (1, or its array's) pass maxQueued.
    exists: (namespace, name) -> whether that job is already known (optional): its create will
        get AlreadyExists, so it is let through.

    Each answer is a function of its review and the cache alone (`admission.decide`): nothing a
    review carries is remembered, so no one who can post here can change another's answer.
    """

    def __init__(
        self,
        lookup: admission.Lookup,
        *,
        exists: Callable[[str, str], bool] | None = None,
        clock: Clock = SYSTEM,
        reload_seconds: float = RELOAD_SECONDS,
        on_refused: Callable[[str, str], None] = lambda namespace, queue: None,
        read_seconds: float = READ_SECONDS,
        skimmer: Skimmer | None = None,
        bounds: Bounds = BOUNDS,
        on_connection_refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.lookup = lookup
        self.bounds, self.on_connection_refused = bounds, on_connection_refused
        self.on_refused = on_refused  # (namespace, queue) of each refusal, for the metrics
        self.exists = exists
        self.clock = clock
        self.reload_seconds = reload_seconds
        self.read_seconds = read_seconds
        self.skimmer = skimmer if skimmer is not None else Skimmer()
        self.reviews = 0  # answered AdmissionReviews
        self.refusals = 0  # of which refused
        self.turned_away = 0  # requests answered 503 because too many were in flight
        self.in_flight = {"small": 0, "large": 0}
        self._server: Server | None = None
        self._certificate: ServingCertificate | None = None

    async def start(self, address: str, cert_file: str | Path, key_file: str | Path) -> None:
        """Serves on `address` ("HOST:PORT"; port 0 picks a free one, see `port`)."""
        self._certificate = ServingCertificate(
            cert_file, key_file, what="admission webhook", clock=self.clock, reload_seconds=self.reload_seconds
        )
        self._server = await serve(
            [web.post(PATH, self._handle)],
            address,
            bounds=self.bounds,
            ssl_context=self._certificate.context,
            max_body=MAX_REQUEST_BYTES,
            on_refused=self.on_connection_refused,
        )
        self._certificate.start()
        log.info("admission webhook serving https://%s:%d%s", split_address(address)[0], self.port, PATH)

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when started on port 0)."""
        assert self._server is not None, "not started"
        return self._server.port

    async def stop(self) -> None:
        if self._certificate is not None:
            await self._certificate.stop()
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self.skimmer.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > MAX_REQUEST_BYTES:
            why = f"a review of {length} bytes is over this webhook's limit of {MAX_REQUEST_BYTES}"
            return await _refuse(request, 413, why, unread=True)
        size = "small" if length is not None and length <= INLINE_BYTES else "large"
        limit = MAX_SMALL_IN_FLIGHT if size == "small" else MAX_LARGE_IN_FLIGHT
        if self.in_flight[size] >= limit:
            self.turned_away += 1
            what = f"up to {INLINE_BYTES} bytes" if size == "small" else f"over {INLINE_BYTES} bytes (or unstated)"
            why = f"this webhook is answering {limit} reviews of {what} already; retry"
            return await _refuse(request, 503, why, unread=True)
        self.in_flight[size] += 1
        try:
            return await self._answer(request, size == "small")
        finally:
            self.in_flight[size] -= 1

    async def _answer(self, request: web.Request, small: bool) -> web.StreamResponse:
        try:
            async with asyncio.timeout(self.read_seconds):
                body = await request.read()
        except TimeoutError:
            why = f"the review's body did not arrive within {self.read_seconds:g} s"
            return await _refuse(request, 408, why, unread=True)
        except web.HTTPRequestEntityTooLarge:  # no Content-Length, and more than the limit came
            why = f"the review is over this webhook's limit of {MAX_REQUEST_BYTES} bytes"
            return await _refuse(request, 413, why, unread=True)
        try:
            fields = skim(body) if small and len(body) <= INLINE_BYTES else await self.skimmer.skim(body)
            submission = admission.read(fields)
        except (NotJson, admission.BadReview) as err:
            return await _refuse(request, 400, str(err))
        except SkimFailed as err:
            log.warning("admission webhook: %s (%d bytes)", err, len(body))
            return await _refuse(request, 503, f"{err}; retry")
        verdict = admission.decide(submission, self.lookup, self.exists)
        self.reviews += 1
        if not verdict.allowed:
            self.refusals += 1
            self.on_refused(submission.namespace, submission.queue)
        return web.json_response(admission.response(submission.review_uid, verdict))


async def _refuse(request: web.Request, status: int, why: str, *, unread: bool = False) -> web.StreamResponse:
    """A request the webhook answers without a verdict: the API server applies failurePolicy
    (Ignore: the create is admitted unchecked), and a person posting by hand reads why.

    unread: the body was not read (all of it): the connection is closed once the answer is out.
    Otherwise aiohttp would go on reading the rest, up to 10 s of it, on the loop, to discard it.
    """
    response = web.Response(status=status, text=f"{why}\n")
    if unread:
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()
    return response


# ----------------------------------------------------------------------------- certificates


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server uses to reach a Service (it dials <service>.<namespace>.svc)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def make_self_signed(
    directory: str | Path,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = ("127.0.0.1",),
    days: int = 365,
) -> bytes:
    """A CA and a serving certificate signed by it, for local use, with the openssl CLI (the
    `cryptography` package is not a dependency). Writes ca.crt, tls.crt and tls.key into
    `directory` and returns the CA bundle (PEM) for the webhook configuration's caBundle."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is missing: install it (apt-get install openssl)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    sans = [f"IP:{ip}" for ip in ip_addresses] + [f"DNS:{name}" for name in dns_names]
    if not sans:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        _openssl(
            "req", "-x509", *ec, "-keyout", str(work / "ca.key"), "-out", str(out / "ca.crt"),
            "-days", str(days), "-subj", "/CN=vigil-webhook-ca",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        _openssl(
            "req", "-new", *ec, "-keyout", str(out / "tls.key"), "-out", str(work / "tls.csr"),
            "-subj", "/CN=vigil-webhook",
        )  # fmt: skip
        (work / "ext").write_text(
            f"subjectAltName={','.join(sans)}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
        _openssl(
            "x509", "-req", "-in", str(work / "tls.csr"), "-CA", str(out / "ca.crt"), "-CAkey", str(work / "ca.key"),
            "-CAcreateserial", "-CAserial", str(work / "ca.srl"), "-days", str(days), "-extfile", str(work / "ext"),
            "-out", str(out / "tls.crt"),
        )  # fmt: skip
    (out / "tls.key").chmod(0o600)
    return (out / "ca.crt").read_bytes()


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


# --------------------------------------------------------------------------- registration


def webhook_configuration(
    name: str,
    ca_bundle: bytes,
    *,
    url: str | None = None,
    service: Mapping[str, Any] | None = None,
    failure_policy: str = FAILURE_POLICY,
    timeout_seconds: int = TIMEOUT_SECONDS,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ValidatingWebhookConfiguration for creates of VigilJobs, reaching the webhook by `url`
    (the test bed: https://127.0.0.1:PORT/validate-vigiljob) or `service` ({namespace, name, port};
    the path is added)."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url and service")
    client_config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode()}
    if service is None:
        client_config["url"] = url
    else:
        client_config["service"] = {**service, "path": PATH}
    webhook: dict[str, Any] = {
        "name": WEBHOOK_NAME,
        "clientConfig": client_config,
        "rules": [
            {
                "apiGroups": [api.GROUP],
                "apiVersions": [api.VERSION],
                "operations": ["CREATE"],
                "resources": [api.PLURAL],
                "scope": "Namespaced",
            }
        ],
        "failurePolicy": failure_policy,
        "sideEffects": "None",  # a review is answered and forgotten: nothing is recorded, dry run or not
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
        "matchPolicy": "Equivalent",  # creates through v1alpha1 are converted to api.VERSION and reviewed too
    }
    if namespace_selector is not None:
        webhook["namespaceSelector"] = dict(namespace_selector)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "vigil"}},
        "webhooks": [webhook],
    }
