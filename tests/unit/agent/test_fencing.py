"""The agent's fencing decisions and beat schedule, on an injected monotonic clock."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vigil.agent import heart, runner
from vigil.core import fencing
from vigil.core.fencing import EXIT_FENCED, UNAUTHORIZED_GRACE_SECONDS, Fencer, Observed, Reason, assess
from vigil.kube.errors import from_status
from vigil.runtime.clock import SYSTEM

pytestmark = pytest.mark.unit

TIMEOUT = 60.0


def fencer(guarantee: str = "AtLeastOnce", started_at: float = 1000.0) -> Fencer:
    return Fencer(timeout=TIMEOUT, guarantee=guarantee, started_at=started_at)  # type: ignore[arg-type]


@pytest.mark.parametrize("guarantee", ["AtLeastOnce", "NoOverlap"])
@pytest.mark.parametrize(
    ("observed", "reason"),
    [
        (Observed.SUPERSEDED, Reason.SUPERSEDED),
        (Observed.DELETING, Reason.DELETED),
        (Observed.GONE, Reason.GONE),
    ],
)
def test_a_superseded_deleted_or_gone_pod_stops_the_child_at_once_under_either_guarantee(guarantee, observed, reason):
    f = fencer(guarantee)
    f.observe(Observed.RENEWED, 1001.0)
    f.observe(observed, 1002.0)
    decision = f.assess(1002.5)
    assert decision.stop is reason
    assert decision.message


def test_renewals_keep_the_child_running():
    f = fencer("NoOverlap")
    for t in range(1000, 1300, 10):
        f.observe(Observed.RENEWED, float(t))
        assert f.assess(t + 5.0).stop is None
        assert not f.assess(t + 5.0).overdue


def test_under_no_overlap_the_child_is_stopped_once_no_renewal_succeeded_for_the_timeout():
    f = fencer("NoOverlap")
    f.observe(Observed.RENEWED, 1010.0)
    for t in (1015.0, 1030.0, 1050.0, 1069.9):
        f.observe(Observed.API_ERROR, t)
        assert f.assess(t).stop is None, t
    assert f.deadline() == 1070.0
    decision = f.assess(1070.0)
    assert decision.stop is Reason.FENCED and decision.overdue
    assert "NoOverlap" in decision.message


def test_under_at_least_once_the_child_keeps_running_and_the_agent_keeps_trying():
    f = fencer("AtLeastOnce")
    f.observe(Observed.RENEWED, 1010.0)
    for t in (1030.0, 1070.0, 5000.0):
        f.observe(Observed.API_ERROR, t)
    decision = f.assess(5000.0)
    assert decision.stop is None and decision.overdue
    assert "AtLeastOnce" in decision.message
    # A renewal ends the doubt.
    f.observe(Observed.RENEWED, 5001.0)
    assert f.assess(5002.0) == fencing.KEEP_GOING


def test_the_timeout_runs_from_the_start_until_the_first_renewal():
    f = fencer("NoOverlap", started_at=1000.0)
    assert f.assess(1059.9).stop is None  # nothing observed yet: the API may just be slow
    assert f.assess(1060.0).stop is Reason.FENCED


def test_a_renewal_counts_from_when_it_was_sent_not_answered():
    f = fencer("NoOverlap")
    f.observe(Observed.RENEWED, 1010.0)  # sent at 1010, answered much later
    assert f.deadline() == 1010.0 + TIMEOUT
    # Reports arriving out of order never move the last renewal back.
    f.observe(Observed.RENEWED, 1005.0)
    assert f.last_renewed_at == 1010.0


def test_under_no_overlap_a_401_after_renewals_means_the_pod_may_be_gone_but_before_any_is_a_setup_error():
    # A pod-bound token stops working when its pod is deleted, and the operator frees the next
    # attempt as soon as it sees the pod gone: under NoOverlap the agent cannot wait for the timeout.
    f = fencer("NoOverlap")
    f.observe(Observed.UNAUTHORIZED, 1001.0)
    assert f.assess(1001.0 + UNAUTHORIZED_GRACE_SECONDS).stop is None, "credentials that never worked are retried"
    f.observe(Observed.RENEWED, 1002.0)
    f.observe(Observed.UNAUTHORIZED, 1003.0)
    f.observe(Observed.API_ERROR, 1010.0)  # a restart's errors between the refusals change nothing
    f.observe(Observed.UNAUTHORIZED, 1003.0 + UNAUTHORIZED_GRACE_SECONDS - 1)
    assert f.assess(1003.0 + UNAUTHORIZED_GRACE_SECONDS - 1).stop is None
    f.observe(Observed.UNAUTHORIZED, 1003.0 + UNAUTHORIZED_GRACE_SECONDS)
    decision = f.assess(1003.0 + UNAUTHORIZED_GRACE_SECONDS)
    assert decision.stop is Reason.GONE and "401" in decision.message
    assert f.deadline() > 1003.0 + UNAUTHORIZED_GRACE_SECONDS, "the refusal stopped it before the timeout would"


def test_under_at_least_once_an_authentication_outage_never_stops_healthy_work():
    """The finding of issue 25: 30 s of 401 after a good beat was read as "pod deleted" and the
    child stopped with exit 75 even under AtLeastOnce. Refusals past the grace and past the
    timeout only warn; the first renewal after the outage clears the warning."""
    f = fencer("AtLeastOnce")
    f.observe(Observed.RENEWED, 1000.0)
    for t in range(1001, 1001 + 3 * int(TIMEOUT), 5):
        f.observe(Observed.UNAUTHORIZED, float(t))
        decision = f.assess(float(t))
        assert decision.stop is None, f"stopped {t - 1000}s into the outage: {decision.message}"
    refused = f.assess(1001.0 + UNAUTHORIZED_GRACE_SECONDS)
    assert refused.refused and "AtLeastOnce" in refused.message and not refused.overdue
    assert f.assess(1000.0 + TIMEOUT).overdue
    f.observe(Observed.RENEWED, 1200.0)
    assert f.assess(1200.0) == fencing.KEEP_GOING


class _Script:
    """The agent's event queue, scripted: each event's time is the agent's clock when it is taken."""

    def __init__(self, events: list[tuple[str, object, float]]) -> None:
        self.events, self.now = list(events), 1000.0

    def get(self, timeout: float | None = None) -> tuple[str, object, float]:
        kind, value, at = self.events.pop(0)
        self.now = at
        return kind, value, at

    def put(self, _: object) -> None:
        pass  # the real child-waiting thread's report: the script says when the child exits


class _Child:
    def __init__(self) -> None:
        self.signals: list[int] = []
        self.exited = heart.threading.Event()
        self.proc = self
        self.returncode = 0

    def wait(self) -> int:
        self.exited.wait()
        return 0

    def signal(self, signum: int) -> None:
        self.signals.append(signum)


class _Heart:
    checkpoint_file = heart.Path("/nonexistent/vigil-test-checkpoint")

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.mark.parametrize(("guarantee", "status"), [("AtLeastOnce", 0), ("NoOverlap", EXIT_FENCED)])
def test_the_agent_keeps_its_child_through_a_401_outage_only_under_at_least_once(monkeypatch, guarantee, status):
    outage = [("observed", Observed.UNAUTHORIZED, 1000.0 + t) for t in range(2, 120, 4)]
    script = _Script([("observed", Observed.RENEWED, 1001.0), *outage, ("exited", 0, 1125.0)])
    monkeypatch.setattr(heart, "CLOCK", lambda: script.now)
    child = _Child()
    settings = heart.Settings(pod_name="p", namespace="n", guarantee=guarantee)
    try:
        got = heart.supervise(settings, child, _Heart(), script)  # type: ignore[arg-type]
    finally:
        child.exited.set()
    assert got == status
    assert child.signals[:1] == ([] if guarantee == "AtLeastOnce" else [heart.signal.SIGTERM])


def test_a_401_from_a_restarting_api_server_stops_nothing_once_the_token_is_accepted_again():
    """A kube-apiserver that has just restarted refuses valid pod-bound tokens for a few seconds
    (seen on the test bed, where the agents took it for their pods deleted and stopped
    healthy jobs): a refusal counts only once it has lasted UNAUTHORIZED_GRACE_SECONDS."""
    f = fencer("AtLeastOnce")
    f.observe(Observed.RENEWED, 1000.0)
    f.observe(Observed.UNAUTHORIZED, 1001.0)
    f.observe(Observed.UNAUTHORIZED, 1005.0)
    assert f.assess(1005.0).stop is None
    f.observe(Observed.RENEWED, 1010.0)
    # The grace runs from the first refusal after the last renewal, not from the first ever.
    f.observe(Observed.UNAUTHORIZED, 1001.0 + UNAUTHORIZED_GRACE_SECONDS)
    assert f.assess(1001.0 + UNAUTHORIZED_GRACE_SECONDS).stop is None


def test_api_errors_are_counted_and_reset_by_a_renewal():
    f = fencer()
    for t in (1.0, 2.0, 3.0):
        f.observe(Observed.API_ERROR, 1000.0 + t)
    assert f.failures == 3
    f.observe(Observed.RENEWED, 1004.0)
    assert f.failures == 0


# --- clocks ---------------------------------------------------------------------------------------


def test_the_agent_runs_on_the_monotonic_clock():
    assert SYSTEM.monotonic == heart.CLOCK  # CLOCK_BOOTTIME where there is one: never the wall clock


@pytest.mark.parametrize("jump", [-86400.0, -3600.0, 3600.0, 86400.0 * 365])
def test_wall_clock_jumps_change_no_decision(monkeypatch, jump: float):
    """The same monotonic history gives the same decisions whatever the wall clock does."""

    def history() -> list[fencing.FenceDecision]:
        f = fencer("NoOverlap")
        out = []
        for t, observed in [(1005.0, Observed.RENEWED), (1020.0, Observed.API_ERROR), (1050.0, Observed.API_ERROR)]:
            f.observe(observed, t)
            out.append(f.assess(t))
        out.append(f.assess(1064.0))
        out.append(f.assess(1066.0))
        return out

    expected = history()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + jump)
    assert history() == expected
    assert expected[-2].stop is None and expected[-1].stop is Reason.FENCED


def test_a_monotonic_clock_that_goes_back_counts_as_no_silence():
    assert assess(Observed.API_ERROR, 2000.0, True, 1000.0, TIMEOUT, "NoOverlap") == fencing.KEEP_GOING


def test_a_forward_jump_of_silence_past_the_timeout_fences_under_no_overlap():
    # A stopped (SIGSTOP) or frozen agent resumes long after its last renewal: it may have been
    # replaced meanwhile, so under NoOverlap it stops before anything else.
    f = fencer("NoOverlap")
    f.observe(Observed.RENEWED, 1001.0)
    assert f.assess(1001.0 + 10 * TIMEOUT).stop is Reason.FENCED


# --- schedule -------------------------------------------------------------------------------------


@given(rand=st.floats(0.0, 1.0, exclude_max=True), interval=st.floats(0.1, 3600.0))
def test_beats_come_every_interval_within_ten_percent(rand: float, interval: float):
    delay = fencing.next_beat_delay(interval, rand)
    assert interval * 0.9 - 1e-9 <= delay <= interval * 1.1 + 1e-9


def test_jitter_spreads_agents_started_together():
    assert fencing.next_beat_delay(10.0, 0.0) == pytest.approx(9.0)
    assert fencing.next_beat_delay(10.0, 0.5) == pytest.approx(10.0)
    assert fencing.next_beat_delay(10.0, 0.999) == pytest.approx(11.0, abs=0.01)


def test_retries_back_off_exponentially_up_to_the_interval():
    delays = [fencing.retry_delay(n, interval=10.0, timeout=600.0, rand=0.5) for n in range(1, 8)]
    assert delays == pytest.approx([0.475, 0.95, 1.9, 3.8, 7.6, 9.5, 9.5])  # each shortened by 10% x 0.5


@given(
    failures=st.integers(1, 10_000),
    interval=st.floats(0.1, 600.0),
    timeout=st.floats(0.5, 3600.0),
    rand=st.floats(0.0, 1.0, exclude_max=True),
)
def test_the_agent_retries_several_times_within_one_timeout(failures, interval, timeout, rand):
    delay = fencing.retry_delay(failures, interval, timeout, rand)
    assert 0 < delay <= timeout / fencing.RETRIES_PER_TIMEOUT
    assert delay <= interval


def test_a_request_never_hangs_longer_than_a_quarter_of_the_timeout_nor_ten_seconds():
    assert fencing.request_timeout(60.0) == 10.0
    assert fencing.request_timeout(20.0) == 5.0
    assert fencing.request_timeout(2.0) == 1.0  # a floor: a TLS handshake needs some time


def test_the_fenced_exit_code_is_distinct_from_shell_codes():
    assert EXIT_FENCED == 75
    assert EXIT_FENCED not in (runner.EXIT_USAGE, runner.EXIT_CANNOT_RUN, runner.EXIT_NOT_FOUND)
    assert heart.exit_status(-9) == 137 and heart.exit_status(3) == 3


# --- what the agent reads from its pod ------------------------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "observed"),
    [
        ({"annotations": {"vigil.dev/heartbeat": "1:a"}}, Observed.RENEWED),
        ({}, Observed.RENEWED),
        ({"annotations": {"vigil.dev/superseded": "2"}}, Observed.SUPERSEDED),
        ({"deletionTimestamp": "2026-01-01T00:00:00Z"}, Observed.DELETING),
    ],
)
def test_the_patched_pod_tells_whether_the_attempt_may_go_on(metadata, observed):
    assert heart.observe_pod({"metadata": metadata}) is observed


def test_api_errors_are_logged_in_one_line_without_headers():
    body = '{"kind":"Status","message":"pods \\"x\\" is forbidden:\\n  User cannot patch"}'
    assert heart.describe_error(from_status(403, body)) == '403 Forbidden: pods "x" is forbidden: User cannot patch'
    assert heart.describe_error(from_status(503, "<html>")) == "503 ServiceUnavailable: <html>"


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({}, "POD_NAME and POD_NAMESPACE not set"),
        ({"POD_NAME": "p", "POD_NAMESPACE": "n", "VIGIL_HEARTBEAT_INTERVAL": "soon"}, "not a number"),
        ({"POD_NAME": "p", "POD_NAMESPACE": "n", "VIGIL_HEARTBEAT_TIMEOUT": "0"}, "greater than 0"),
        ({"POD_NAME": "p", "POD_NAMESPACE": "n", "VIGIL_GUARANTEE": "ExactlyOnce"}, "AtLeastOnce or NoOverlap"),
    ],
)
def test_bad_settings_say_what_to_fix(env, problem):
    with pytest.raises(heart.ConfigError, match=problem):
        heart.Settings.from_env(env)


def test_settings_default_as_documented():
    s = heart.Settings.from_env({"POD_NAME": "p", "POD_NAMESPACE": "n"})
    assert (s.interval, s.timeout, s.guarantee, s.grace) == (10.0, 60.0, "AtLeastOnce", 10.0)
