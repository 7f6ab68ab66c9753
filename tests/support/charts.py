"""The Helm chart and the tools of the test bed (helm, helm-docs, promtool), as the tests run them.

The tools come from testbed/build.sh (~/.cache/vigil/bin, or $VIGIL_CACHE/bin); without them the
tests that need them fail, they do not skip: the chart and the rules would go untested.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.waits import deadline

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "vigil"
BIN = Path(os.environ.get("VIGIL_CACHE", Path.home() / ".cache" / "vigil")) / "bin"
KUBE_VERSION = "1.36.3"  # the chart asks for >= 1.30; helm's own default is older


def tool(name: str) -> Path:
    path = BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} not found at {path}: run testbed/build.sh (it builds {name} into {BIN})")
    return path


def run(*command: object) -> subprocess.CompletedProcess[str]:
    """A command of the repository, from its root (at most 300 s: a hung tool fails the test)."""
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=deadline(300), cwd=ROOT)


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return run(tool("helm"), *args)


def helm(*args: str) -> str:
    """helm's output; fails the test if helm fails."""
    result = run_helm(*args)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def helm_template(*sets: str, strings: tuple[str, ...] = (), jsons: tuple[str, ...] = ()) -> list[dict]:
    """The chart rendered for release `vigil` in vigil-system, with `--set`, `--set-string` and
    `--set-json` values (`--set` reads 0.5 as a string: fractions go through `jsons`)."""
    args = ["template", "vigil", str(CHART), "--namespace", "vigil-system", "--kube-version", KUBE_VERSION]
    for value in sets:
        args += ["--set", value]
    for value in strings:
        args += ["--set-string", value]
    for value in jsons:
        args += ["--set-json", value]
    result = run_helm(*args)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
