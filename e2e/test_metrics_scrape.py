"""/metrics scraped while jobs run, and after, compared with what the API server shows.

Two `vigil operator --leader-elect` processes, each serving /metrics on a port of its own, run a
mix of jobs through one VigilQueue (maxRunning 3; retry budget off, so that retries do not wait
on its floor of 3 a minute): some succeed, some fail once and then succeed, one dead-letters on
a poison exit code. The scrapes are parsed with prometheus-client's own parser and checked
against the cluster:

- gauges: `vigil_jobs{phase}` against a LIST of the VigilJobs grouped by status.phase,
  `vigil_queue_depth` / `vigil_queue_running` against the VigilQueue's status (while the jobs run,
  a moment where scrape, LIST and scrape agree is waited for; after, they must agree outright),
  `leader_election_master_status` 1 on the leader and 0 on the standby;
- counters: attempts started = attempt pods created = the jobs' status.attempts summed; attempts
  finished by outcome = the outcomes in the jobs' histories; one dead letter; one retry per flaky
  job; histograms (reconcile time, API request duration by verb, queue wait) have observations;
- cardinality: no label value of any series is a job's or a pod's name, and the set of series
  after 25 jobs is the set after 5 (the second batch repeats the first one's kinds of jobs);
- OpenMetrics: a scrape of each replica with the OpenMetrics `Accept` header Prometheus sends
  parses with prometheus-client's strict OpenMetrics parser (each family once, `# EOF` last),
  and shows `vigil_build_info` (this version) and `process_resident_memory_bytes`.

The heartbeat-gap histogram stays empty here: kwok's simulated pods run no vigil-agent (heartbeat
required: false), so there are no beats to measure; e2e/test_heartbeats.py has them.
A scrape taken during the run is saved to /tmp/metrics-sample.txt.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

import vigil
from tests.support.cluster import Kube, free_port, install_crds
from tests.support.jobs import FAST_BACKOFF, create, vigil_job, vigil_queue
from tests.support.operators import electing, holder, identity, metrics_text
from tests.support.waits import poll, wait_until
from vigil import api
from vigil.api import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.e2e

QUEUE = "batch"
SAMPLE = Path("/tmp/metrics-sample.txt")


def scrape(port: int) -> str:
    text = metrics_text(port)  # on a kept-alive connection, as Prometheus scrapes
    if text is None:
        raise OSError(f"the operator's /metrics on port {port} does not answer")
    return text


def samples(text: str) -> list:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels` (0 when none)."""
    return sum(
        s.value for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples(text) if s.name == name and s.value}


def series(text: str) -> set[tuple]:
    return {(s.name, tuple(sorted(s.labels.items()))) for s in samples(text)}


def job(name: str, exit_code: str, run_for: str = "1s", **retry: object) -> dict:
    retry = {"maxAttempts": 3, "backoff": FAST_BACKOFF, **retry}
    return vigil_job(name, exit_code=exit_code, run_for=run_for, queue=QUEUE, retry=retry)


def batch(prefix: str, count: int, poison: bool, run_for: str = "1s") -> list[dict]:
    """Jobs in a fixed mix: two in five succeed at once, two fail once first; one poison if asked."""
    jobs = []
    for i in range(count):
        if poison and i == count - 1:
            jobs.append(job(f"{prefix}-poison-{i}", "3", nonRetryableExitCodes=[3]))
        elif i % 2:
            jobs.append(job(f"{prefix}-flaky-{i}", "1,0"))
        else:
            jobs.append(job(f"{prefix}-ok-{i}", "0", run_for))
    return jobs


# Labels whose values come from fixed vocabularies (phases, outcomes, verbs, HTTP codes, why an event was dropped...) or
# from names people choose for a handful of objects (namespace, queue): never one per job.
BOUNDED_LABELS = {"name", "controller", "result", "outcome", "reason", "verb", "resource", "code", "cause"}
BOUNDED_LABELS |= {"namespace", "queue", "phase", "le"}
BOUNDED_LABELS |= {"generation"}  # the garbage collector's: 0, 1 or 2
BOUNDED_LABELS |= {"server"}  # which of the operator's servers: health, metrics, webhook or beats
# vigil_build_info's and python_info's: one value per process
BOUNDED_LABELS |= {"version", "python_version", "implementation", "major", "minor", "patchlevel"}
# What Prometheus sends when it prefers OpenMetrics (its scrape_protocols' default order).
OPENMETRICS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def settled(port: int, check: Callable[[str], None], within: float = 15) -> str:
    """A scrape on which `check` passes, within `within` seconds (else its assertion): the
    operator's caches follow the API server by a watch event, so a LIST may show a write a
    moment before /metrics does."""
    failed: list[AssertionError] = []

    def passing() -> str | None:
        text = scrape(port)
        try:
            check(text)
        except AssertionError as err:
            failed.append(err)
            return None
        return text

    text = poll(passing, within, interval=0.5)
    if text is None:
        raise failed[-1]
    return text


class Cluster:
    """What the API server shows of the test's namespace."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace

    def jobs(self) -> list[dict]:
        return self.kube.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]

    def phases(self) -> dict[str, int]:
        return dict(Counter((j.get("status") or {}).get("phase") or "New" for j in self.jobs()))

    def queue(self) -> dict:
        queue = self.kube.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, api.QUEUE_PLURAL, QUEUE)
        return queue.get("status") or {}

    def pods(self) -> list:
        return self.kube.core.list_namespaced_pod(self.namespace, label_selector=api.LABEL_JOB_UID).items

    def finished(self) -> bool:
        return all((j.get("status") or {}).get("phase") in ("Succeeded", "DeadLettered") for j in self.jobs())


def phases_scraped(text: str) -> dict[str, int]:
    return {phase: int(n) for phase, n in by_label(text, "vigil_jobs", "phase").items()}


def queue_scraped(text: str, namespace: str) -> tuple[float, float]:
    return (
        value(text, "vigil_queue_depth", namespace=namespace, queue=QUEUE),
        value(text, "vigil_queue_running", namespace=namespace, queue=QUEUE),
    )


def check_counters(text: str, cluster: Cluster, flaky: int, dead: int) -> None:
    jobs, pods = cluster.jobs(), cluster.pods()
    attempts = sum((j.get("status") or {}).get("attempts") or 0 for j in jobs)
    assert value(text, "vigil_attempts_started_total") == len(pods) == attempts
    outcomes = Counter(record.get("outcome") for j in jobs for record in (j.get("status") or {}).get("history") or [])
    assert by_label(text, "vigil_attempts_finished_total", "outcome") == dict(outcomes)
    assert value(text, "vigil_dead_letters_total") == dead
    assert value(text, "vigil_dead_letters_total", reason="NonRetryableExitCode") == dead
    assert value(text, "vigil_retries_total") == flaky
    assert value(text, "vigil_queue_starts_total", namespace=cluster.namespace, queue=QUEUE) == attempts
    # histograms with observations
    assert value(text, "controller_runtime_reconcile_time_seconds_count") > 0
    assert value(text, "vigil_queue_wait_seconds_count", namespace=cluster.namespace, queue=QUEUE) == attempts
    for verb in ("create", "patch"):  # pods and events created; job status patched (the watches are not timed)
        assert value(text, "vigil_api_request_duration_seconds_count", verb=verb) > 0, verb
    assert value(text, "vigil_attempt_duration_seconds_count") == sum(outcomes.values())
    assert value(text, "vigil_heartbeat_gap_seconds_count") == 0  # no agent in kwok's pods: no beats


def check_openmetrics(port: int, cluster: Cluster | None = None) -> None:
    """A scrape as Prometheus makes it when it prefers OpenMetrics: strictly parsed (a family
    named twice, as the gauge vigil_attempts_uncertain once was beside its counter, refuses the
    whole scrape), with the build and the process's memory, and, given the `cluster` (settled),
    its jobs by phase as the text format and the API server say."""
    text = metrics_text(port, accept=OPENMETRICS_ACCEPT)
    assert text is not None and text.endswith("# EOF\n"), f"not OpenMetrics: {(text or '')[-200:]!r}"
    families = {}
    for family in parse_openmetrics(text):
        assert family.name not in families, f"{family.name} twice"
        families[family.name] = family
    build = [s for s in families["vigil_build"].samples if s.name == "vigil_build_info"]
    assert [(s.labels["version"], s.value) for s in build] == [(vigil.__version__, 1)]
    rss = families["process_resident_memory_bytes"].samples[0].value
    assert 10 * 2**20 < rss < 2**30, f"RSS {rss / 2**20:.0f} MiB"  # a live Python, not a placeholder
    assert families["vigil_uncertain_attempts"].samples[0].value == 0  # kwok's pods never go silent
    if cluster is not None:
        phases = {s.labels["phase"]: s.value for s in families["vigil_jobs"].samples if s.value}
        assert phases == cluster.phases()


def check_names_are_no_labels(texts: list[str], cluster: Cluster) -> None:
    names = {j["metadata"]["name"] for j in cluster.jobs()} | {p.metadata.name for p in cluster.pods()}
    values = {v for text in texts for s in samples(text) for v in s.labels.values()}
    assert not names & values, f"job or pod names used as label values: {sorted(names & values)}"


def test_metrics_during_a_run_agree_with_the_cluster_and_do_not_grow_with_jobs(
    kube: Kube, own_namespace: str, tmp_path: Path
):
    namespace = own_namespace
    install_crds(kube)
    cluster = Cluster(kube, namespace)
    ports = [free_port(), free_port()]
    operators = []
    for i, port in enumerate(ports):
        operator = electing(kube, namespace, tmp_path / f"operator-{i}.log")
        # Plain HTTP on 127.0.0.1 (--metrics-insecure): this test reads what is served; who may
        # read it is e2e/test_hostile_metrics.py's.
        operator.extra_args = (*operator.extra_args, "--metrics-address", f"127.0.0.1:{port}", "--metrics-insecure")
        if i == 0:  # as the chart runs it: its log read below
            operator.extra_args = (*operator.extra_args, "--log-format", "json")
        operators.append(operator)
        operator.start()
    try:
        leader_id = wait_until(lambda: holder(kube, namespace), 30, "a leader")
        wait_until(lambda: all(identity(op) for op in operators), 30, "both to campaign")
        leader = next(i for i, op in enumerate(operators) if identity(op) == leader_id)
        port, standby_port = ports[leader], ports[1 - leader]
        wait_until(lambda: _answers(port) and _answers(standby_port), 30, "both to serve /metrics")
        kube.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            api.QUEUE_PLURAL,
            vigil_queue(QUEUE, maxRunning=3, retryBudget=1),  # budget off: retries as they come
        )
        assert value(scrape(port), "leader_election_master_status") == 1
        assert value(scrape(standby_port), "leader_election_master_status") == 0

        # 5 jobs: 2 succeed, 2 fail once first, 1 dead-letters.
        first = batch("m1", 5, poison=True, run_for="5s")  # long enough to be caught running
        for j in first:
            create(kube, namespace, j)
        texts = []

        def agrees_while_running() -> bool:
            before, phases, queue, after = scrape(port), cluster.phases(), cluster.queue(), scrape(port)
            texts.append(before)
            running = any(p not in ("Succeeded", "DeadLettered") for p in phases)
            agree = phases_scraped(before) == phases == phases_scraped(after)
            queue_agrees = queue_scraped(before, namespace) == (queue.get("queued"), queue.get("running"))
            return running and agree and queue_agrees and phases_scraped(before) != {}

        wait_until(agrees_while_running, 30, "a scrape during the run that agrees with the cluster", interval=0.1)
        during = texts[-1]
        SAMPLE.write_text(during)
        assert value(during, "vigil_attempts_started_total") > 0

        wait_until(cluster.finished, 60, "the first 5 jobs to finish")
        wait_until(
            lambda: (cluster.queue().get("queued"), cluster.queue().get("running")) == (0, 0), 15, "the queue status"
        )

        def after_5(text: str) -> None:
            assert phases_scraped(text) == cluster.phases() == {"Succeeded": 4, "DeadLettered": 1}
            assert queue_scraped(text, namespace) == (0, 0)
            check_counters(text, cluster, flaky=2, dead=1)

        at5 = settled(port, after_5)

        def standing_by(text: str) -> None:
            assert value(text, "leader_election_master_status") == 0
            assert phases_scraped(text) == cluster.phases()  # warm caches on the standby too
            assert value(text, "vigil_attempts_started_total") == 0  # and no work

        standby = settled(standby_port, standing_by)

        # 20 more of the same kinds (no poison): the series stay the same.
        for j in batch("m2", 20, poison=False):
            create(kube, namespace, j)
        wait_until(cluster.finished, 90, "all 25 jobs to finish")

        def after_25(text: str) -> None:
            assert phases_scraped(text) == cluster.phases() == {"Succeeded": 24, "DeadLettered": 1}
            assert queue_scraped(text, namespace) == (0, 0)
            check_counters(text, cluster, flaky=2 + 10, dead=1)

        at25 = settled(port, after_25)
        texts += [at5, at25, standby, scrape(standby_port)]
        check_openmetrics(port, cluster)  # settled at 25 (after_25): nothing moves any more
        check_openmetrics(standby_port)
        check_names_are_no_labels(texts, cluster)
        keys = {k for text in texts for sample in samples(text) for k in sample.labels}
        assert keys <= BOUNDED_LABELS, f"labels of unknown cardinality: {keys - BOUNDED_LABELS}"
        grown = series(at25) - series(at5)
        print(
            f"\nmetrics: {len(series(at5))} series at 5 jobs, {len(series(at25))} at 25 jobs; "
            f"new at 25: {sorted(grown)}; sample during the run saved to {SAMPLE}"
        )
        # Series may only appear for a new kind of event (an API error code seen for the first
        # time, say), never for a new job: a handful at most, each from a bounded vocabulary.
        assert len(series(at25)) <= len(series(at5)) + 3, f"series appeared with more jobs: {sorted(grown)}"
        assert all(name.startswith(("vigil_api_request_errors", "controller_runtime_reconcile")) for name, _ in grown)
    finally:
        for operator in operators:
            operator.stop()
    check_json_log(operators[0].log_path)


def check_json_log(path: Path) -> None:
    """`--log-format json`: every line the operator wrote, from its start to its stop, is one JSON
    object with the fields a log pipeline reads."""
    lines = path.read_text().splitlines()
    assert lines, "the operator logged nothing"
    for line in lines:
        entry = json.loads(line)  # a line that is not JSON (a bare traceback, a print) fails here
        assert {"time", "level", "logger", "message"} <= set(entry), line


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True
