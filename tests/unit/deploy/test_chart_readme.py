"""charts/vigil/README.md is what helm-docs renders from values.yaml and README.md.gotmpl, so that
its values table cannot drift from the values (it had: operator.defaultQueue.maxRunning,
resources). helm-docs comes from testbed/build.sh (~/.cache/vigil/bin, or $VIGIL_CACHE/bin);
without it the test fails, naming the command that builds it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.charts import CHART, run, tool

pytestmark = pytest.mark.unit

# As the README says to run it: the values in values.yaml's order, no footer (its version and date).
HELM_DOCS_ARGS = ("--sort-values-order", "file", "--skip-version-footer")


def rendered(tmp_path: Path) -> str:
    """README.md as helm-docs renders it now, in a copy of the chart (the checkout is not touched)."""
    copy = tmp_path / "vigil"
    shutil.copytree(CHART, copy)
    (copy / "README.md").unlink()
    result = run(tool("helm-docs"), "--chart-search-root", copy, *HELM_DOCS_ARGS)
    assert result.returncode == 0, f"helm-docs failed:\n{result.stdout}\n{result.stderr}"
    return (copy / "README.md").read_text()


def test_the_readme_is_what_helm_docs_renders_from_the_values(tmp_path: Path):
    assert (CHART / "README.md").read_text() == rendered(tmp_path), (
        "charts/vigil/README.md is not what helm-docs renders from values.yaml and README.md.gotmpl: edit "
        "those, then run `helm-docs -c charts/vigil -s file --skip-version-footer` from the repository root"
    )


def test_a_changed_description_changes_the_render(tmp_path: Path):
    # A guard on the comparison: the rendered table follows values.yaml's `# --` comments.
    values = (CHART / "values.yaml").read_text()
    assert "# -- Jobs reconciled concurrently." in values
    copy = tmp_path / "edited"
    shutil.copytree(CHART, copy)
    (copy / "values.yaml").write_text(values.replace("# -- Jobs reconciled concurrently.", "# -- Workers."))
    result = run(tool("helm-docs"), "--chart-search-root", copy, *HELM_DOCS_ARGS)
    assert result.returncode == 0, result.stderr
    table = (copy / "README.md").read_text()
    assert "| operator.workers | int | `4` | Workers. |" in table
    assert table != (CHART / "README.md").read_text()
