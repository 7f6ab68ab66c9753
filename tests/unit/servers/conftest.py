"""What the server tests share: one self-signed CA and serving certificate per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil.servers.webhook import make_self_signed


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    make_self_signed(directory)
    return directory
