"""The job-side checkpoint API: size limit, atomic write, clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vigil import agent
from vigil.agent import (
    CheckpointTooLarge,
    InvalidCheckpoint,
    NotUnderAgent,
    checkpoint,
    previous_checkpoint,
    validate_checkpoint,
)
from vigil.api import MAX_CHECKPOINT_BYTES

pytestmark = pytest.mark.unit


@pytest.fixture
def checkpoint_file(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "checkpoint.json"
    monkeypatch.setenv("VIGIL_CHECKPOINT_FILE", str(path))
    return path


def padded(total: int) -> dict:
    """A checkpoint whose compact JSON is exactly `total` bytes."""
    return {"p": "x" * (total - len('{"p":""}'))}


def test_a_checkpoint_is_written_as_compact_json(checkpoint_file: Path):
    checkpoint({"offset": 1200, "files": ["a", "b"]})
    assert checkpoint_file.read_text() == '{"offset":1200,"files":["a","b"]}'


def test_exactly_the_limit_is_accepted_one_byte_more_is_refused_and_the_old_one_kept(checkpoint_file: Path):
    checkpoint(padded(MAX_CHECKPOINT_BYTES))
    assert len(checkpoint_file.read_bytes()) == MAX_CHECKPOINT_BYTES
    checkpoint({"step": 1})
    with pytest.raises(CheckpointTooLarge) as err:
        checkpoint(padded(MAX_CHECKPOINT_BYTES + 1))
    assert err.value.size == MAX_CHECKPOINT_BYTES + 1 and err.value.limit == 2048
    assert "2049 bytes" in str(err.value) and "2048" in str(err.value)
    assert isinstance(err.value, ValueError)
    assert json.loads(checkpoint_file.read_text()) == {"step": 1}


def test_non_ascii_is_escaped_so_bytes_and_characters_agree(checkpoint_file: Path):
    # The admission policy's CEL counts characters; the operator counts bytes: ASCII makes them one.
    checkpoint({"name": "déjà vu ✓"})
    raw = checkpoint_file.read_bytes()
    assert raw.isascii() and json.loads(raw) == {"name": "déjà vu ✓"}
    with pytest.raises(CheckpointTooLarge):
        checkpoint({"p": "é" * 400})  # 400 characters, but 2400 bytes escaped


def test_what_is_not_json_is_refused_clearly(checkpoint_file: Path):
    with pytest.raises(InvalidCheckpoint, match="JSON-serialisable"):
        checkpoint({"when": object()})
    with pytest.raises(InvalidCheckpoint):
        checkpoint({"x": float("nan")})  # NaN is not JSON
    assert not checkpoint_file.exists()


def test_outside_an_agent_checkpoint_says_how_to_run_it(monkeypatch):
    monkeypatch.delenv("VIGIL_CHECKPOINT_FILE", raising=False)
    with pytest.raises(NotUnderAgent, match="vigil-agent -- CMD"):
        checkpoint({"step": 1})


def test_the_write_is_atomic_a_temp_file_renamed_into_place(checkpoint_file: Path, monkeypatch):
    checkpoint({"step": 1})
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src, dst):
        # At the instant of the rename the old checkpoint is still whole.
        assert json.loads(Path(dst).read_text()) == {"step": 1}
        assert json.loads(Path(src).read_text()) == {"step": 2}
        renames.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(agent.os, "replace", spy)
    checkpoint({"step": 2})
    [(src, dst)] = renames
    assert Path(src).parent == checkpoint_file.parent and dst == str(checkpoint_file)
    assert sorted(p.name for p in checkpoint_file.parent.iterdir()) == ["checkpoint.json"]


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temp_file(checkpoint_file: Path, monkeypatch):
    checkpoint({"step": 1})

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(agent.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint({"step": 2})
    assert json.loads(checkpoint_file.read_text()) == {"step": 1}
    assert sorted(p.name for p in checkpoint_file.parent.iterdir()) == ["checkpoint.json"]


@pytest.mark.parametrize(("env", "expected"), [(None, None), ("", None), ("  ", None), ('{"step":3}', {"step": 3})])
def test_previous_checkpoint_reads_what_the_operator_handed_over(monkeypatch, env, expected):
    if env is None:
        monkeypatch.delenv("VIGIL_CHECKPOINT", raising=False)
    else:
        monkeypatch.setenv("VIGIL_CHECKPOINT", env)
    assert previous_checkpoint() == expected


def test_a_previous_checkpoint_that_is_not_json_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("VIGIL_CHECKPOINT", "{oops")
    with pytest.raises(InvalidCheckpoint, match="VIGIL_CHECKPOINT is not JSON"):
        previous_checkpoint()


def test_the_agent_validates_what_it_reads_from_the_file():
    assert validate_checkpoint(b'{"a":1}') == '{"a":1}'
    assert validate_checkpoint(b'{"a": 1}\n') == '{"a": 1}'  # a shell's echo: the newline is not published
    with pytest.raises(InvalidCheckpoint):
        validate_checkpoint(b"{half")
    with pytest.raises(InvalidCheckpoint):
        validate_checkpoint(b"\xff\xfe")
    with pytest.raises(CheckpointTooLarge):
        validate_checkpoint(b'"' + b"x" * MAX_CHECKPOINT_BYTES + b'"')
