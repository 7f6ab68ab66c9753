"""The admission webhook's shell: an HTTPS server (aiohttp) that answers AdmissionReviews with
`vigil.core.admission.review`, plus what it takes to run one: a self-signed certificate for local use
and the ValidatingWebhookConfiguration that points the API server at it.

The decisions (failurePolicy Ignore, timeout 5 s, the overshoot bound, the certificate and its
rotation) are argued in docs/admission.md.

It runs in the operator's event loop, beside the watches, so `lookup` reads the operator's
cache directly and `Pending.seen` is called by the job watch in the same loop. The certificate
files are re-read when they change (a renewed Secret, mounted by the kubelet, or cert-manager's
renewal), so a rotation needs no restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from vigil import api
from vigil.core import admission
from vigil.runtime.clock import SYSTEM, Clock
from vigil.servers.http import Server, serve, split_address

log = logging.getLogger(__name__)

PATH = "/validate-vigiljob"
WEBHOOK_NAME = "maxqueued.vigil.dev"  # the webhook's name inside the configuration (API errors cite it)
FAILURE_POLICY = "Ignore"  # docs/admission.md: durable submission over an exact cap
TIMEOUT_SECONDS = 5
# An AdmissionReview carries the whole job; the API server takes request bodies up to 3 MiB and
# etcd objects up to 1.5 MiB, so 8 MiB is a cap on garbage, not on any legal job.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
CERT_RELOAD_SECONDS = 10.0  # how often the certificate files are checked for a renewal


class WebhookServer:
    """POST /validate-vigiljob over HTTPS: AdmissionReview v1 in, AdmissionReview v1 out.

    lookup: (namespace, queue) -> (the queue's spec or None, jobs of it waiting now), from the
        operator's cache, without I/O.
    pending: jobs this server admitted that the watch has not shown yet; the job watch calls
        `pending.seen(namespace, name, uid)` for every job it delivers.
    exists: (namespace, name) -> whether that job is already known (optional): its create will
        get AlreadyExists, so it is not counted.
    """

    def __init__(
        self,
        lookup: admission.Lookup,
        pending: admission.Pending | None = None,
        *,
        exists: Callable[[str, str], bool] | None = None,
        clock: Clock = SYSTEM,
        reload_seconds: float = CERT_RELOAD_SECONDS,
        on_refused: Callable[[str, str], None] = lambda namespace, queue: None,
    ) -> None:
        self.lookup = lookup
        self.on_refused = on_refused  # (namespace, queue) of each refusal, for the metrics
        self.pending = pending if pending is not None else admission.Pending()
        self.exists = exists
        self.clock = clock
        self.reload_seconds = reload_seconds
        self.reviews = 0  # answered AdmissionReviews
        self.refusals = 0  # of which refused
        self._server: Server | None = None
        self._reloader: asyncio.Task | None = None

    async def start(self, address: str, cert_file: str | Path, key_file: str | Path) -> None:
        """Serves on `address` ("HOST:PORT"; port 0 picks a free one, see `port`)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(cert_file), str(key_file))
        self._server = await serve(
            [web.post(PATH, self._handle)], address, ssl_context=context, max_body=MAX_REQUEST_BYTES
        )
        self._reloader = asyncio.create_task(self._reload(context, Path(cert_file), Path(key_file)))
        log.info("admission webhook serving https://%s:%d%s", split_address(address)[0], self.port, PATH)

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when started on port 0)."""
        assert self._server is not None, "not started"
        return self._server.port

    async def stop(self) -> None:
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
            self._reloader = None
        if self._server is not None:
            await self._server.stop()
            self._server = None

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            body = await request.json(loads=json.loads)
        except web.HTTPException:
            raise  # 413 for a body over MAX_REQUEST_BYTES
        except (ValueError, UnicodeDecodeError):
            return web.Response(status=400, text="expected a JSON AdmissionReview v1\n")
        try:
            answer = admission.review(body, self.lookup, self.pending, self.clock.monotonic(), self.exists)
        except admission.BadReview as err:
            return web.Response(status=400, text=f"{err}\n")
        self.reviews += 1
        if not answer["response"]["allowed"]:
            self.refusals += 1
            submission = admission.parse(body)
            self.on_refused(submission.namespace, submission.queue)
        return web.json_response(answer)

    async def _reload(self, context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
        """Loads a renewed certificate into the live context: new handshakes use it at once."""
        loaded = _read_pair(cert_file, key_file)
        while True:
            await self.clock.sleep(self.reload_seconds)
            current = _read_pair(cert_file, key_file)
            if current is None or current == loaded:
                continue
            try:
                context.load_cert_chain(str(cert_file), str(key_file))
            except (ssl.SSLError, OSError) as err:  # half-written pair: keep the old one, try again
                log.warning("admission webhook: the renewed certificate does not load yet (%s)", err)
                continue
            loaded = current
            log.info("admission webhook: loaded the renewed certificate from %s", cert_file)


def _read_pair(cert_file: Path, key_file: Path) -> tuple[bytes, bytes] | None:
    try:
        return cert_file.read_bytes(), key_file.read_bytes()
    except OSError:
        return None


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
        "sideEffects": "None",  # Pending is this process's memory, and dry runs are not recorded
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
        "matchPolicy": "Equivalent",
    }
    if namespace_selector is not None:
        webhook["namespaceSelector"] = dict(namespace_selector)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "vigil"}},
        "webhooks": [webhook],
    }
