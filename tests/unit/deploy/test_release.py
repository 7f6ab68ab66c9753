"""One version, one place, and the chart's CRDs as an upgrade needs them.

vigil.__version__ (operator/vigil/__init__.py) is the release's version: the package reads it
(pyproject's dynamic version), and the chart's version and appVersion, the image's tag, `vigil
--version` and the CHANGELOG's newest entry must say the same, or a user would install a chart
whose default image does not exist. The chart renders the CRDs from files/crds/ (the repository's
crds/, byte for byte), so `helm upgrade` upgrades them, kept on uninstall unless told otherwise.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import orjson
import pytest
import yaml

import vigil
from tests.support.charts import helm_template
from vigil import cli
from vigil.kube import stdjson

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "vigil"
CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CRD_NAMES = ["vigiljobs.vigil.dev.yaml", "vigilqueues.vigil.dev.yaml", "vigilworkerpools.vigil.dev.yaml"]
KEEP = "helm.sh/resource-policy"


def test_the_package_reads_its_version_from_vigil():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"], "a version in pyproject.toml would be a second place"
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vigil.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", vigil.__version__)


def test_the_chart_says_the_same_version():
    assert CHART_YAML["version"] == vigil.__version__
    assert CHART_YAML["appVersion"] == vigil.__version__


def test_the_default_image_is_the_one_make_image_builds():
    # `helm install` with the defaults must name the image testbed/image.sh tags (its second name,
    # localhost/vigil:<version>), the name release/dist.sh saves in the image's archive.
    tags = subprocess.run(
        [str(ROOT / "testbed" / "image.sh"), "--print-tags"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert VALUES["image"]["tag"] == ""  # the appVersion
    assert tags[1] == f"{VALUES['image']['repository']}:{vigil.__version__}"


def test_vigil_version_prints_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"vigil {vigil.__version__}"


def test_the_changelog_has_the_version_on_top():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.MULTILINE)
    assert releases and releases[0] == vigil.__version__, f"CHANGELOG.md's newest release is {releases[:1]}"
    assert "0.1.0" in releases


# ------------------------------------------------------------------------------------ the CRDs


@pytest.mark.parametrize("name", CRD_NAMES)
def test_the_charts_crds_are_the_repositorys(name: str):
    assert (CHART / "files" / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
        f"charts/vigil/files/crds/{name} differs from crds/{name}: run `python -m vigil.api.crd`"
    )
    assert sorted(p.name for p in (CHART / "files" / "crds").iterdir()) == sorted(
        p.name for p in (ROOT / "crds").iterdir()
    )
    # Helm's own crds/ directory is never upgraded: the CRDs must not be there as well.
    assert not (CHART / "crds").exists()


def crds_of(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}


def test_the_chart_renders_the_crds_kept_by_default():
    rendered = crds_of(helm_template())
    for name in CRD_NAMES:
        crd = rendered[name.removesuffix(".yaml")]
        assert crd["metadata"]["annotations"] == {KEEP: "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/version"] == vigil.__version__
        # The rest is the generated file's, unchanged (labels and annotations only added).
        generated = yaml.safe_load((ROOT / "crds" / name).read_text())
        crd["metadata"] = {"name": crd["metadata"]["name"]}
        assert crd == generated
    assert len(rendered) == len(CRD_NAMES)


def test_crds_keep_false_lets_an_uninstall_delete_them():
    rendered = crds_of(helm_template("crds.keep=false"))
    assert len(rendered) == len(CRD_NAMES)
    assert all(KEEP not in (crd["metadata"].get("annotations") or {}) for crd in rendered.values())


def test_crds_enabled_false_renders_none():
    assert crds_of(helm_template("crds.enabled=false")) == {}


# ------------------------------------------------------------------- what the plugin's zipapp needs

NO_COMPILED = """
import sys
for name in ("pydantic", "pydantic_core", "orjson"):
    sys.modules[name] = None  # as in the zipapp, which can import no compiled module
import vigil.api
print(vigil.api.GROUP, vigil.api.PLURAL)
try:
    vigil.api.VigilJob
except ImportError:
    print("models need pydantic")
del sys.modules["pydantic"], sys.modules["pydantic_core"]  # kubernetes >= 37 needs it (the zipapp has 36)
from vigil.kube import client
print(client.orjson.__name__)
"""


def test_the_api_names_and_the_client_import_without_compiled_modules():
    # release/plugin.py builds kubectl-vigil from these: vigil.api's models load on first use only,
    # and the client falls back to the standard library's json (e2e/test_install_from_artifacts.py
    # runs the zipapp itself).
    result = subprocess.run([sys.executable, "-c", NO_COMPILED], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["vigil.dev vigiljobs", "models need pydantic", "vigil.kube.stdjson"]


def test_stdjson_writes_what_orjson_writes():
    value = {"metadata": {"name": "nightly-ß", "labels": {"a": "1"}}, "spec": {"n": [1, 2.5, None, True]}}
    assert stdjson.dumps(value) == orjson.dumps(value)
    assert stdjson.loads(orjson.dumps(value)) == value
    with pytest.raises(stdjson.JSONDecodeError):
        stdjson.loads(b"{not json")
