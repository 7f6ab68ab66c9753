"""The chart's NOTES.txt names the RBAC the release made: a Role per namespace when
operator.watchNamespaces names namespaces only (no ClusterRole for the operator then), the
ClusterRole otherwise. `helm template` does not render NOTES.txt, so a copy of the chart renders
it as a value of a template of its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.charts import CHART, KUBE_VERSION, run_helm

pytestmark = pytest.mark.unit


def notes(tmp_path: Path, *sets: str) -> str:
    copy = tmp_path / "vigil"
    if not copy.exists():
        shutil.copytree(CHART, copy)
        text = (CHART / "templates" / "NOTES.txt").read_text()
        wrapper = '{{- define "test.notes" }}' + text + '{{- end }}\nnotes: {{ include "test.notes" . | toJson }}\n'
        (copy / "templates" / "test-notes.yaml").write_text(wrapper)
    args = ["template", "vigil", str(copy), "-n", "vigil-system", "--kube-version", KUBE_VERSION]
    for value in sets:
        args += ["--set", value]
    result = run_helm(*args, "--show-only", "templates/test-notes.yaml")
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return yaml.safe_load(result.stdout)["notes"]


def test_the_default_release_names_its_cluster_role(tmp_path: Path):
    text = notes(tmp_path)
    assert "  - ClusterRole/ClusterRoleBinding vigil\n" in text
    assert "Role/RoleBinding vigil-leader-election in vigil-system" in text


def test_namespaces_by_name_are_named_with_their_roles_and_no_cluster_role(tmp_path: Path):
    text = notes(tmp_path, "operator.watchNamespaces={team-a,team-b}")
    assert "Role/RoleBinding vigil in each watched namespace (team-a, team-b)" in text
    assert "ClusterRole/ClusterRoleBinding vigil\n" not in text and "ClusterRole/ClusterRoleBinding vigil " not in text
    assert "ClusterRole/ClusterRoleBinding vigil-metrics-auth" in text  # TokenReviews are cluster-scoped
    without_metrics_auth = notes(tmp_path, "operator.watchNamespaces={team-a}", "metrics.secure=false")
    assert "in each watched namespace (team-a), nothing cluster-wide\n" in without_metrics_auth


def test_a_glob_keeps_the_cluster_role_and_says_why(tmp_path: Path):
    text = notes(tmp_path, "operator.watchNamespaces={team-*}")
    assert "ClusterRole/ClusterRoleBinding vigil (cluster-wide: a glob in operator.watchNamespaces" in text
    assert "in each watched namespace" not in text


def test_the_crds_are_said_as_the_values_handle_them(tmp_path: Path):
    default = notes(tmp_path)
    assert (
        "CRDs vigiljobs.vigil.dev, vigilqueues.vigil.dev and vigilworkerpools.vigil.dev, upgraded with the release "
        "and kept on uninstall" in default
    )
    assert "\n\nUpgrading: `helm upgrade` upgrades the CRDs with the release" in default
    assert "charts/vigil/crds" not in default  # the chart has no crds/ directory
    unkept = notes(tmp_path, "crds.keep=false")
    assert "deleted on uninstall with every job, queue and worker pool (crds.keep=false)" in unkept
    off = notes(tmp_path, "crds.enabled=false")
    assert "CRDs vigiljobs" not in off
    assert "apply them yourself, server-side" in off and "kubectl apply --server-side -f crds/" in off
