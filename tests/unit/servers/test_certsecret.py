"""The operator's own certificates, kept (vigil.servers.certsecret), against a fake API server
that answers as the real one does (404 for what is not there, 409 AlreadyExists for a second
create, 409 Conflict for an update whose resourceVersion is stale): the Secret is made once and
then kept, the files the servers read are written whole, the webhook's every caBundle is the CA,
replicas racing agree on one Secret, and the hourly re-check picks up a renewal or a Secret
someone else replaced."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import functools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tests.support.clock import FakeClock
from vigil.core import certs
from vigil.kube.errors import ApiError, Conflict, NotFound
from vigil.servers import certsecret

pytestmark = pytest.mark.unit

NS, NAME, CONFIG = "vigil-system", "vigil-certs", "vigil"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
SECRET = f"{SECRETS}/{NAME}"
WEBHOOK_CONFIG = f"{certsecret.WEBHOOKS}/{CONFIG}"
LEAVES = (
    certs.Leaf("webhook", certs.service_names("vigil-webhook", NS)),
    certs.Leaf("metrics", certs.service_names("vigil-metrics", NS)),
)


class FakeApiServer:
    """Secrets and ValidatingWebhookConfigurations by path, with resourceVersions; `before` runs
    before a request is answered (another writer acting in between)."""

    def __init__(self, *, with_webhook: bool = True) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.requests: list[tuple[str, str]] = []
        self.before: dict[tuple[str, str], Callable[[], None]] = {}
        if with_webhook:
            self.put_object(WEBHOOK_CONFIG, {"metadata": {"name": CONFIG}, "webhooks": [{"name": "a"}, {"name": "b"}]})

    def put_object(self, path: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.objects[path] = obj

    async def request(self, method: str, path: str, *, body: Any = None) -> Any:
        self.requests.append((method, path))
        hook = self.before.pop((method, path), None)
        if hook is not None:
            hook()
        if method == "GET":
            if path not in self.objects:
                raise NotFound(f"{path.rsplit('/', 1)[1]} not found", status=404, reason="NotFound")
            return copy.deepcopy(self.objects[path])
        if method == "POST" and path == SECRETS:
            target = f"{SECRETS}/{body['metadata']['name']}"
            if target in self.objects:
                raise Conflict("secrets already exists", status=409, reason="AlreadyExists")
            self.put_object(target, body)
            return copy.deepcopy(self.objects[target])
        if method == "PUT":
            if path not in self.objects:
                raise NotFound("not found", status=404, reason="NotFound")
            if body["metadata"].get("resourceVersion") != self.objects[path]["metadata"]["resourceVersion"]:
                raise Conflict("the object has been modified; please apply your changes", status=409, reason="Conflict")
            self.put_object(path, body)
            return copy.deepcopy(self.objects[path])
        raise AssertionError(f"unexpected request {method} {path}")

    def secret_data(self) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in self.objects[SECRET]["data"].items()}

    def bundles(self) -> list[str | None]:
        return [w.get("clientConfig", {}).get("caBundle") for w in self.objects[WEBHOOK_CONFIG]["webhooks"]]

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] != "GET"]


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The test run to its end on an event loop of its own (as the other server tests do)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def keeper(
    api: FakeApiServer, directory: Path, clock: FakeClock, *, webhook: bool = True
) -> certsecret.CertificateKeeper:
    managed = certs.Managed(NAME, NS, directory, LEAVES, CONFIG if webhook else None)
    return certsecret.CertificateKeeper(api, managed, clock=clock, ca_name="vigil-certs-ca")


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def secret_of(data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


@sync
async def test_no_secret_creates_it_writes_the_files_and_sets_every_caBundle(tmp_path: Path):
    api, clock = FakeApiServer(), FakeClock()
    ca = await keeper(api, tmp_path / "certs", clock).ensure()
    assert api.writes() == [("POST", SECRETS), ("PUT", WEBHOOK_CONFIG)]
    stored = api.secret_data()
    assert ca == stored["ca.crt"]
    assert files(tmp_path / "certs") == {k: v for k, v in stored.items() if k != "ca.key"}, "the CA's key stays out"
    assert api.bundles() == [base64.b64encode(ca).decode()] * 2
    for key in ("webhook.key", "metrics.key"):
        assert (tmp_path / "certs" / key).stat().st_mode & 0o077 == 0, "a key only its owner reads"
    assert not [p for p in (tmp_path / "certs").iterdir() if p.name.startswith(".")], "a temporary file left"


@sync
async def test_a_valid_secret_is_read_and_nothing_written(tmp_path: Path):
    api, clock = FakeApiServer(), FakeClock()
    await keeper(api, tmp_path / "a", clock).ensure()
    before = copy.deepcopy(api.objects)
    api.requests.clear()
    ca = await keeper(api, tmp_path / "b", clock).ensure()  # another replica, or a restart
    assert api.writes() == [] and api.objects == before
    assert files(tmp_path / "b") == files(tmp_path / "a") and ca == api.secret_data()["ca.crt"]


@sync
async def test_a_replica_that_creates_second_uses_the_first_ones_secret(tmp_path: Path):
    api, clock = FakeApiServer(), FakeClock()
    first = certs.decide(None, LEAVES, clock.wall(), "other-ca").data
    # Between this replica's GET (404) and its POST, another replica creates the Secret.
    api.before[("POST", SECRETS)] = lambda: api.put_object(SECRET, secret_of(first))
    ca = await keeper(api, tmp_path, clock).ensure()
    assert ca == first["ca.crt"] and api.secret_data() == first
    assert (tmp_path / "webhook.crt").read_bytes() == first["webhook.crt"]
    assert api.requests.count(("GET", SECRET)) == 2


@sync
async def test_a_renewal_that_loses_a_race_reads_again_and_keeps_the_ca(tmp_path: Path):
    api, clock = FakeApiServer(), FakeClock()
    old = certs.decide(None, LEAVES, clock.wall() - dt.timedelta(days=340), "vigil-certs-ca").data
    api.put_object(SECRET, secret_of(old))
    # Another replica renews first: this one's PUT carries a stale resourceVersion (409).
    theirs = certs.decide(old, LEAVES, clock.wall(), "vigil-certs-ca").data
    api.before[("PUT", SECRET)] = lambda: api.put_object(SECRET, secret_of(theirs))
    ca = await keeper(api, tmp_path, clock).ensure()
    assert ca == old["ca.crt"] and api.secret_data() == theirs, "their renewal stands, the CA unchanged"
    assert (tmp_path / "webhook.crt").read_bytes() == theirs["webhook.crt"]
    assert [r for r in api.writes() if r[1] == SECRET] == [("PUT", SECRET)]


@sync
async def test_a_caBundle_write_that_loses_a_race_reads_again(tmp_path: Path):
    api, clock = FakeApiServer(), FakeClock()
    api.before[("PUT", WEBHOOK_CONFIG)] = lambda: api.put_object(
        WEBHOOK_CONFIG, {**api.objects[WEBHOOK_CONFIG], "webhooks": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}
    )
    ca = await keeper(api, tmp_path, clock).ensure()
    assert api.bundles() == [base64.b64encode(ca).decode()] * 3, "every webhook, the one added meanwhile too"


@sync
async def test_the_hourly_recheck_renews_and_picks_up_a_replaced_secret(tmp_path: Path):
    api, clock = FakeApiServer(), FakeClock()
    kept = keeper(api, tmp_path, clock)
    ca = await kept.ensure()
    await kept.start()
    try:
        # Someone replaces the Secret (deleted and made anew: a rotation): picked up within the hour.
        replaced = certs.decide(None, LEAVES, clock.wall(), "rotated-ca").data
        api.put_object(SECRET, secret_of(replaced))
        await clock.advance(certsecret.RECHECK_SECONDS)
        assert (tmp_path / "webhook.crt").read_bytes() == replaced["webhook.crt"]
        assert api.bundles() == [base64.b64encode(replaced["ca.crt"]).decode()] * 2 != [ca]
        # 340 days on, the leaves are within 30 days of their end: renewed with the same CA.
        clock.now += 340 * 86400  # asleep meanwhile: its next hourly check is the first one due
        await clock.advance(certsecret.RECHECK_SECONDS)
        renewed = api.secret_data()
        assert renewed["ca.crt"] == replaced["ca.crt"] and renewed["webhook.crt"] != replaced["webhook.crt"]
        assert (tmp_path / "webhook.crt").read_bytes() == renewed["webhook.crt"]
    finally:
        await kept.stop()


@sync
async def test_a_webhook_configuration_not_there_yet_is_set_when_it_comes(tmp_path: Path):
    api, clock = FakeApiServer(with_webhook=False), FakeClock()
    kept = keeper(api, tmp_path, clock)
    ca = await kept.ensure()
    assert not kept.bundle_kept
    await kept.start()
    try:
        api.put_object(WEBHOOK_CONFIG, {"metadata": {"name": CONFIG}, "webhooks": [{"name": "a"}]})
        await clock.advance(certsecret.RETRY_SECONDS)
        assert api.bundles() == [base64.b64encode(ca).decode()] and kept.bundle_kept
    finally:
        await kept.stop()


@sync
async def test_at_start_it_tries_until_the_api_server_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    api, clock = FakeApiServer(), FakeClock()
    refusals = iter([True, True])
    answer = api.request

    async def unreachable_twice(method: str, path: str, *, body: Any = None) -> Any:
        if (method, path) == ("GET", SECRET) and next(refusals, False):
            raise ApiError("GET secrets: connection refused")
        return await answer(method, path, body=body)

    api.request = unreachable_twice  # type: ignore[method-assign]
    monkeypatch.setattr(certsecret, "RETRY_SECONDS", 0.01)  # real time: ensure_at_start waits on `stopping`
    ca = await asyncio.wait_for(certsecret.ensure_at_start(keeper(api, tmp_path, clock), asyncio.Event()), 5)
    assert ca == api.secret_data()["ca.crt"] and (tmp_path / "webhook.crt").exists()
    assert caplog.text.count("not ready (GET secrets: connection refused)") == 2
    assert "PRIVATE KEY" not in caplog.text and "BEGIN" not in caplog.text


@sync
async def test_at_start_a_stop_ends_the_tries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    api, clock = FakeApiServer(), FakeClock()

    async def unreachable(method: str, path: str, *, body: Any = None) -> Any:
        raise ApiError("connection refused")

    api.request = unreachable  # type: ignore[method-assign]
    stopping = asyncio.Event()
    stopping.set()
    assert await asyncio.wait_for(certsecret.ensure_at_start(keeper(api, tmp_path, clock), stopping), 5) is None
