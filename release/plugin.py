"""kubectl-vigil as one self-contained file: a zipapp of the `vigil` package and the pure-Python
code of what the plugin imports, run by any Python 3.11 or later (`python3 kubectl-vigil`, or as
`kubectl vigil` from the PATH: its first line is `#!/usr/bin/env python3`).

A zipapp can import no compiled module (zipimport loads .py files only), so it carries none:
- the plugin's import path avoids pydantic and orjson (vigil.api imports its models on first use,
  vigil.kube.client falls back to vigil.kube.stdjson);
- aiohttp, multidict, yarl, frozenlist, propcache and PyYAML fall back to their pure-Python code
  when their extensions are missing, so those are removed from the vendored wheels;
- kubernetes is pinned below 37, which imports pydantic (its ApiClient) with the package.
The vendored versions are REQUIREMENTS, resolved by pip; their licences (dist-info) ride along.

Usage: python3 release/plugin.py OUT  (release/dist.sh runs it)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipapp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What vigil.plugin imports besides the standard library, at the versions the operator is tested with
# (kubernetes excepted, see above). pip resolves what these need.
REQUIREMENTS = ["aiohttp==3.14.5", "kubernetes==36.0.3", "PyYAML==6.0.4"]
COMPILED = ("*.so", "*.pyd", "*.dylib")
MAIN = """import sys

if sys.version_info < (3, 11):
    sys.exit(f"kubectl-vigil needs Python 3.11 or later; this is {sys.version.split()[0]}")

from vigil.plugin.cli import main

sys.exit(main())
"""


def build(out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "app"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
             "--only-binary", ":all:", "--target", str(app), *REQUIREMENTS],
            check=True,
        )  # fmt: skip
        for pattern in COMPILED:
            for path in app.rglob(pattern):
                path.unlink()
        shutil.rmtree(app / "bin", ignore_errors=True)  # the dependencies' console scripts
        shutil.copytree(
            ROOT / "operator" / "vigil",
            app / "vigil",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        for cache in app.rglob("__pycache__"):
            shutil.rmtree(cache)
        (app / "__main__.py").write_text(MAIN)
        out.parent.mkdir(parents=True, exist_ok=True)
        zipapp.create_archive(app, out, interpreter="/usr/bin/env python3", compressed=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build(Path(sys.argv[1])))
