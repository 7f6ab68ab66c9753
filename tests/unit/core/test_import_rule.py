"""The layout's one rule: `vigil.core` (every pure decision) imports only the standard library,
pydantic, `vigil.api` and PyJWT with its cryptography (pure computation: verifying a token's
signature reads nothing and sends nothing). So the core can be read, tested and reasoned about without a cluster,
a network or an event loop, and importing it costs none of the I/O libraries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

IO_LIBRARIES = ("aiohttp", "orjson", "urllib3", "kubernetes", "prometheus_client", "yaml")

PROBE = """
import importlib, json, pkgutil, sys
before = set(sys.modules)
import vigil.core
for module in pkgutil.walk_packages(vigil.core.__path__, "vigil.core."):
    importlib.import_module(module.name)
loaded = sorted(set(sys.modules) - before)
print(json.dumps(loaded))
"""


def loaded_by_the_core() -> list[str]:
    """The modules a fresh interpreter loads to import every module of vigil.core."""
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def test_importing_the_core_loads_no_io_library():
    loaded = loaded_by_the_core()
    assert [name for name in loaded if name.split(".")[0] in IO_LIBRARIES] == []
    assert "vigil.core.lifecycle" in loaded and "vigil.core.queueing.book" in loaded, "the probe imported the core"


def test_the_core_needs_nothing_but_the_standard_library_pydantic_and_the_api():
    allowed = set(sys.stdlib_module_names) | {"pydantic", "pydantic_core", "typing_extensions", "annotated_types"}
    allowed |= {"typing_inspection", "_pytest", "__main__"}
    allowed |= {"jwt", "cryptography", "cffi", "_cffi_backend", "_openssl"}  # vigil.core.beats verifies tokens
    outside = sorted(
        {
            name.split(".")[0]
            for name in loaded_by_the_core()
            if name.split(".")[0] not in allowed
            and not name.startswith(("vigil.core", "vigil.api", "_sysconfigdata"))  # the latter: the stdlib's
            and name != "vigil"
        }
    )
    assert outside == [], f"vigil.core loads {outside}: move the I/O out of the core"
