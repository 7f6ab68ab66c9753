"""The storage migration's decisions: which CRD may be migrated, what the no-op write and the
storedVersions record are (fenced, and nothing else), and what each error leads to."""

from __future__ import annotations

import pytest

from vigil.core import storage
from vigil.core.storage import Next

pytestmark = pytest.mark.unit


def crd(storage_version: str = "v1beta1", stored: tuple[str, ...] = ("v1alpha1", "v1beta1")) -> dict:
    return {
        "metadata": {"name": "vigiljobs.vigil.dev", "resourceVersion": "77"},
        "spec": {
            "versions": [
                {"name": "v1beta1", "served": True, "storage": storage_version == "v1beta1"},
                {"name": "v1alpha1", "served": True, "storage": storage_version == "v1alpha1", "deprecated": True},
            ]
        },
        "status": {"storedVersions": list(stored)},
    }


def test_a_crd_is_read_for_its_storage_and_stored_versions() -> None:
    state = storage.CrdState.of(crd())
    assert state == storage.CrdState(
        name="vigiljobs.vigil.dev",
        resource_version="77",
        storage="v1beta1",
        served=("v1beta1", "v1alpha1"),
        stored_versions=("v1alpha1", "v1beta1"),
    )


def test_an_old_crd_is_refused_with_what_to_do() -> None:
    """Before this release's CRDs are applied, a rewrite would store v1alpha1 again: refuse."""
    with pytest.raises(storage.NotReady, match=r"stores v1alpha1, not v1beta1: apply this release's CRDs first"):
        storage.check_ready(storage.CrdState.of(crd("v1alpha1", ("v1alpha1",))), "v1beta1")
    storage.check_ready(storage.CrdState.of(crd()), "v1beta1")


def test_migrated_only_when_storedversions_holds_the_storage_version_alone() -> None:
    assert not storage.migrated(storage.CrdState.of(crd()), "v1beta1")
    assert not storage.migrated(storage.CrdState.of(crd(stored=("v1alpha1",))), "v1beta1")
    assert storage.migrated(storage.CrdState.of(crd(stored=("v1beta1",))), "v1beta1")


def test_the_rewrite_carries_the_resourceversion_and_nothing_else() -> None:
    """Spec, status, labels and annotations are never in the patch: it cannot change them."""
    job = {"metadata": {"name": "a", "resourceVersion": "12", "labels": {"x": "y"}}, "spec": {"queue": "q"}}
    assert storage.rewrite_patch(job) == {"metadata": {"resourceVersion": "12"}}


def test_storedversions_is_recorded_fenced_by_the_crd_as_read_before_the_migration() -> None:
    assert storage.stored_versions_patch(storage.CrdState.of(crd()), "v1beta1") == {
        "metadata": {"resourceVersion": "77"},
        "status": {"storedVersions": ["v1beta1"]},
    }


def test_what_each_error_leads_to() -> None:
    assert storage.after_error(404, 0, 0) is Next.GONE
    assert storage.after_error(409, 1, 0) is Next.REREAD
    assert storage.after_error(409, storage.MAX_CONFLICTS - 1, 0) is Next.REREAD
    assert storage.after_error(409, storage.MAX_CONFLICTS, 0) is Next.FAIL
    for transient in (0, 429, 500, 503, 504):
        assert storage.after_error(transient, 0, 1) is Next.WAIT
        assert storage.after_error(transient, 0, storage.MAX_TRANSIENT) is Next.FAIL
    for refused in (400, 401, 403, 422):
        assert storage.after_error(refused, 0, 0) is Next.FAIL


def test_only_an_expired_continue_token_restarts_the_list() -> None:
    assert storage.list_restarts(410)
    assert not any(storage.list_restarts(status) for status in (0, 403, 404, 409, 500))


def test_transient_waits_double_up_to_a_bound() -> None:
    assert [storage.transient_delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert storage.transient_delay(20) == storage.MAX_TRANSIENT_DELAY_SECONDS
