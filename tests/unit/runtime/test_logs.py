"""`--log-format json`: one JSON object a line, with the fields a log pipeline filters on (the
namespace, name, controller and attempt a line is about), as `vigil.runtime.logs` writes it."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.clock import FakeClock
from tests.support.controllers import job_controller
from vigil.agent import heart
from vigil.cli import main as cli_main
from vigil.runtime import logs

pytestmark = pytest.mark.unit

START = "2026-11-29T10:00:00Z"
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def written() -> Iterator[io.StringIO]:
    """What the root logger writes once configured as `vigil operator --log-format json` does."""
    stream = io.StringIO()
    root, factory, level = logging.getLogger(), logging.getLogRecordFactory(), logging.getLogger().level
    logs.configure("debug", "json", stream)
    try:
        yield stream
    finally:
        for handler in [h for h in root.handlers if getattr(h, "stream", None) is stream]:
            root.removeHandler(handler)
        logging.setLogRecordFactory(factory)
        root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]  # each line one object, or it raises


def test_a_record_about_an_attempt_is_one_json_line_with_its_fields(written: io.StringIO):
    log = logging.getLogger("vigil.test")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        log.exception("attempt %d of %s\nfailed", 2, "ns/j", extra=logs.about("ns", "j", attempt=2, controller="x"))
    text = written.getvalue()
    assert text.count("\n") == 1, "the message's and the traceback's newlines are escaped"
    [line] = lines(written)
    assert RFC3339_UTC.match(line["time"]), line["time"]
    assert (line["level"], line["logger"], line["message"]) == ("error", "vigil.test", "attempt 2 of ns/j\nfailed")
    assert (line["namespace"], line["name"], line["controller"], line["attempt"]) == ("ns", "j", "x", 2)
    assert isinstance(line["exc_info"], str) and "ValueError: boom" in line["exc_info"]


def test_a_line_logged_outside_any_reconcile_has_no_job_fields(written: io.StringIO):
    logging.getLogger("vigil.test").info("listening on %s", "127.0.0.1:8443")
    [line] = lines(written)
    assert set(line) == {"time", "level", "logger", "message"}


class ApiDown:
    """An API server that answers nothing: every call raises."""

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            raise OSError(f"connection refused ({name})")

        return call


def test_the_job_reconcilers_lines_carry_the_job_its_controller_and_attempt(written: io.StringIO):
    # Its log calls name the job in the message only; the worker's context adds the fields.
    clock = FakeClock()
    c = job_controller(ApiDown(), clock)
    meta = {"name": "nightly", "namespace": "team-a", "uid": "job-uid", "resourceVersion": "5", "generation": 1}
    failed_pod = {
        "metadata": {
            "name": "nightly-2",
            "namespace": "team-a",
            "uid": "pod-uid",
            "resourceVersion": "9",
            "labels": {"vigil.dev/job-uid": "job-uid", "vigil.dev/attempt": "2"},
            "ownerReferences": [{"kind": "VigilJob", "name": "nightly", "uid": "job-uid", "controller": True}],
        },
        "status": {"phase": "Failed"},
    }
    c.handlers.job_seen(
        {
            "metadata": meta,
            "spec": {"template": {}, "retry": {"maxAttempts": 5}},
            "status": {
                "phase": "Running",
                "attempts": 2,
                "currentAttempt": {"number": 2, "podName": "nightly-2", "phase": "Running", "startedAt": START},
            },
        }
    )
    c.handlers.pod_changed(failed_pod)

    async def one_look() -> None:
        key = await c.queue.get()
        try:
            await c.worker.process(key)
        finally:
            c.queue.done(key)

    asyncio.run(one_look())
    logging.getLogger("vigil.test").info("after the reconcile")
    about_job = [line for line in lines(written) if "team-a/nightly" in line["message"]]
    assert about_job, written.getvalue()
    for line in about_job:
        assert (line["namespace"], line["name"], line["controller"], line["attempt"]) == (
            "team-a",
            "nightly",
            "vigiljob",
            2,
        ), line
    assert "namespace" not in lines(written)[-1], "the context ends with the reconcile"


def test_the_cli_takes_the_format_and_keeps_text_for_a_terminal(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        cli_main(["operator", "--log-format", "yaml"])
    assert "invalid choice: 'yaml'" in capsys.readouterr().err
    for command in ("operator", "release-finalizers"):
        with pytest.raises(SystemExit):
            cli_main([command, "--help"])
        assert "--log-format {text,json}" in capsys.readouterr().out, command
    root = logging.getLogger()
    handlers, level, stream = list(root.handlers), root.level, io.StringIO()
    logs.configure("info", stream=stream)  # the flag's default
    try:
        logging.getLogger("vigil.test").info("plain")
        assert re.search(r" INFO vigil.test: plain$", stream.getvalue().strip())
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


def test_the_agent_logs_json_lines_about_its_job_when_asked():
    env = {"POD_NAMESPACE": "team-a", "POD_NAME": "nightly-2", "VIGIL_JOB": "nightly", "VIGIL_ATTEMPT": "2"}
    assert heart.log_line("beating again", env) == "vigil-agent: beating again", "text unless asked"
    line = json.loads(heart.log_line("warning: not beating:\nleader gone", {**env, "VIGIL_LOG_FORMAT": "json"}))
    assert RFC3339_UTC.match(line.pop("time"))
    assert line == {
        "level": "warning",
        "logger": "vigil-agent",
        "message": "warning: not beating:\nleader gone",
        "namespace": "team-a",
        "name": "nightly",
        "attempt": 2,
        "pod": "nightly-2",
    }
