"""A server's certificate: the files it was given, as a live TLS context, reloaded when they
change (a renewed Secret, mounted by the kubelet, or cert-manager's renewal), so a rotation needs
no restart. One for each server that speaks TLS (the webhook, the beats, the metrics)."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from vigil.runtime.background import Background
from vigil.runtime.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

RELOAD_SECONDS = 10.0  # how often the files are checked for a renewal


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """The server side of TLS 1.2 or later with the certificate pair given."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


class ServingCertificate:
    """`context` serves the pair of files; `run()` (a task) loads a renewed pair into it, so new
    handshakes use it at once and open connections keep theirs."""

    def __init__(
        self,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        what: str,
        clock: Clock = SYSTEM,
        reload_seconds: float = RELOAD_SECONDS,
    ) -> None:
        self.cert_file, self.key_file, self.what = Path(cert_file), Path(key_file), what
        self.clock, self.reload_seconds = clock, reload_seconds
        self.context = server_context(cert_file, key_file)
        self._loaded = self._read()
        self._watching = Background(self._watch)

    def start(self) -> None:
        self._watching.start()

    async def stop(self) -> None:
        await self._watching.stop()

    async def _watch(self) -> None:
        while True:
            await self.clock.sleep(self.reload_seconds)
            self.reload()

    def reload(self) -> bool:
        """Loads the files if they changed since last loaded; whether it did."""
        current = self._read()
        if current is None or current == self._loaded:
            return False
        try:
            self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (ssl.SSLError, OSError) as err:  # half-written pair: keep the old one, try again
            log.warning("%s: the renewed certificate does not load yet (%s)", self.what, err)
            return False
        self._loaded = current
        log.info("%s: loaded the renewed certificate from %s", self.what, self.cert_file)
        return True

    def _read(self) -> tuple[bytes, bytes] | None:
        try:
            return self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError:
            return None
