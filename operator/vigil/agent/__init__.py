"""The tiny API for a job's own code, when it runs under `vigil-agent`.

    from vigil.agent import checkpoint, previous_checkpoint

    done = previous_checkpoint() or {"offset": 0}   # where an earlier attempt got to
    ...
    checkpoint({"offset": 1200})                    # published by the agent within 30 s, and at exit

A checkpoint is small JSON (at most 2 KiB). It is written to a file the agent watches, never
sent to the API server from here: the job's code needs no credentials and no network.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

from vigil.api import ANNOTATION_CHECKPOINT, ENV_CHECKPOINT_FILE, MAX_CHECKPOINT_BYTES

__all__ = [
    "ANNOTATION_CHECKPOINT",
    "ENV_CHECKPOINT",
    "ENV_CHECKPOINT_FILE",
    "CheckpointTooLarge",
    "InvalidCheckpoint",
    "NotUnderAgent",
    "checkpoint",
    "encode_checkpoint",
    "previous_checkpoint",
    "validate_checkpoint",
]

ENV_CHECKPOINT = "VIGIL_CHECKPOINT"  # set by the operator: the last checkpoint of an earlier attempt


class CheckpointTooLarge(ValueError):
    """The checkpoint's JSON is over the limit the pod annotation (and the admission policy) allow."""

    def __init__(self, size: int, limit: int = MAX_CHECKPOINT_BYTES):
        super().__init__(
            f"checkpoint is {size} bytes of JSON, over the limit of {limit} bytes: "
            "keep only what is needed to resume (an offset, a cursor, an id), not the data itself"
        )
        self.size, self.limit = size, limit


class InvalidCheckpoint(ValueError):
    """The checkpoint is not JSON."""


class NotUnderAgent(RuntimeError):
    """checkpoint() was called in a process not started by `vigil-agent`."""


def encode_checkpoint(data: Any) -> str:
    """Compact JSON, ASCII only: its length in bytes is its length in characters, so the agent,
    the operator and the admission policy (CEL counts characters) all agree on the size."""
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise InvalidCheckpoint(f"checkpoint must be JSON-serialisable: {err}") from err
    if len(text) > MAX_CHECKPOINT_BYTES:
        raise CheckpointTooLarge(len(text))
    return text


def validate_checkpoint(raw: bytes) -> str:
    """The checkpoint as the agent publishes it, or InvalidCheckpoint / CheckpointTooLarge.

    The agent re-checks what it reads from the file: a job may write the file without this API
    (a shell's `echo`, say, whose trailing newline is not published: JSON's whitespace means nothing).
    """
    if len(raw) > MAX_CHECKPOINT_BYTES:
        raise CheckpointTooLarge(len(raw))
    try:
        text = raw.decode("utf-8").strip()
        json.loads(text)
    except (ValueError, RecursionError) as err:  # bad UTF-8 or JSON; or 2 KiB of nested brackets
        raise InvalidCheckpoint(f"checkpoint file is not JSON: {err}") from err
    return text


def checkpoint(data: Any) -> None:
    """Records `data` (JSON-serialisable, at most 2048 bytes as compact JSON) as this attempt's
    checkpoint. The agent publishes it with its next heartbeat when it beats by the pod's
    annotation, and at most every 30 s when it beats to the operator (always at once when the
    command exits); the next attempt gets the last one published as previous_checkpoint()."""
    text = encode_checkpoint(data)  # refuse before touching the file: a bad call keeps the old one
    path = os.environ.get(ENV_CHECKPOINT_FILE)
    if not path:
        raise NotUnderAgent(
            f"checkpoint() needs ${ENV_CHECKPOINT_FILE}, which vigil-agent sets for the command it runs: "
            "start the job as `vigil-agent -- CMD ARGS...`"
        )
    directory = os.path.dirname(path) or "."
    # Temp file + rename in the same directory: the agent reads either the old or the new
    # checkpoint, never half of one.
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def previous_checkpoint() -> Any | None:
    """The last checkpoint an earlier attempt of this job published, or None (first attempt,
    or no attempt checkpointed)."""
    raw = os.environ.get(ENV_CHECKPOINT, "")
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as err:
        raise InvalidCheckpoint(f"${ENV_CHECKPOINT} is not JSON ({err}): {raw[:80]!r}") from err
