"""`vigil`: the command line. `vigil operator` runs the operator against the current kubeconfig;
`vigil release-finalizers` removes its finalizers once no operator will; `vigil migrate-storage`
rewrites every object at the storage version after an upgrade."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vigil import __version__
from vigil.core.beats import CONNECTIONS_PER_SOURCE as BEAT_CONNECTIONS_PER_SOURCE
from vigil.core.beats import PATH as BEAT_PATH
from vigil.core.election import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
    ElectionConfig,
    InvalidTimings,
)
from vigil.core.liveness import STAMP_WRITES_PER_SECOND
from vigil.core.manifest import BeatChannel
from vigil.core.queueing.book import QueueSpec
from vigil.kube.informer import MAX_POD_WATCH_PACE_SECONDS, POD_WATCH_PACE_SECONDS
from vigil.runtime import logs

if TYPE_CHECKING:
    from vigil.core.certs import Managed

DEFAULT_LEASE_NAME = "vigil-operator"
DEFAULT_QUEUE_RETRY_BUDGET = QueueSpec().retry_budget  # a VigilQueue's own default
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def add_election_flags(parser: argparse.ArgumentParser) -> None:
    """The leader-election flags of `vigil operator` (docs/leader-election.md)."""
    group = parser.add_argument_group("leader election")
    group.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run only while holding the Lease; needed with more than one replica (default: off)",
    )
    group.add_argument("--lease-name", default=DEFAULT_LEASE_NAME, help=f"default: {DEFAULT_LEASE_NAME}")
    group.add_argument(
        "--lease-namespace", default=None, help="default: $POD_NAMESPACE, else the namespace of the pod it runs in"
    )
    for flag, default, what in (
        ("--lease-duration", DEFAULT_LEASE_DURATION, "how long a standby waits on an unchanged Lease"),
        ("--renew-deadline", DEFAULT_RENEW_DEADLINE, "how long the leader may go without renewing"),
        ("--retry-period", DEFAULT_RETRY_PERIOD, "how often to renew, or to try to acquire"),
    ):
        group.add_argument(flag, type=float, default=default, metavar="SECONDS", help=f"{what} (default: {default:g})")


def election_config(args: argparse.Namespace) -> ElectionConfig:
    """The timings given; InvalidTimings (naming the flag) when they cannot work together."""
    return ElectionConfig(args.lease_duration, args.renew_deadline, args.retry_period)


def lease_namespace(args: argparse.Namespace, service_account_namespace: str = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """--lease-namespace, else $POD_NAMESPACE, else the pod's own namespace; InvalidTimings outside a pod."""
    if args.lease_namespace:
        return args.lease_namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(service_account_namespace) as f:
            namespace = f.read().strip()
    except OSError:
        namespace = ""
    if not namespace:
        raise InvalidTimings("--lease-namespace is required outside a pod (or set POD_NAMESPACE)")
    return namespace


def _operator(args: argparse.Namespace) -> int:
    # Imported here: a flag refused is refused before the operator's libraries load.
    from vigil import manager
    from vigil.kube import config

    if not 0 <= args.pod_watch_pace <= MAX_POD_WATCH_PACE_SECONDS:
        print(
            f"vigil operator: --pod-watch-pace must be between 0 and {MAX_POD_WATCH_PACE_SECONDS:g} seconds, "
            f"not {args.pod_watch_pace:g}",
            file=sys.stderr,
        )
        return 2
    if args.beat_connections is not None and args.beat_connections < 1:
        print(
            f"vigil operator: --beat-connections must be at least 1, not {args.beat_connections} (leave it out to "
            "follow the container's memory and open-file limits)",
            file=sys.stderr,
        )
        return 2
    if args.beat_connections_per_source < 1:
        print(
            f"vigil operator: --beat-connections-per-source must be at least 1, not {args.beat_connections_per_source}",
            file=sys.stderr,
        )
        return 2
    if not args.heartbeat_stamp_writes_per_second > 0:
        print(
            "vigil operator: --heartbeat-stamp-writes-per-second must be a positive rate, "
            f"not {args.heartbeat_stamp_writes_per_second:g}",
            file=sys.stderr,
        )
        return 2
    default_queue = None
    if args.default_queue_max_running is not None:
        try:
            default_queue = default_queue_policy(args.default_queue_max_running, args.default_queue_retry_budget)
        except ValueError as err:
            print(f"vigil operator: {err}", file=sys.stderr)
            return 2
    elif args.default_queue_retry_budget is not None:
        print("vigil operator: --default-queue-retry-budget needs --default-queue-max-running", file=sys.stderr)
        return 2
    managed = None
    if args.self_managed_certs_secret:
        managed, refused = self_managed_certificates(args)
        if refused:
            print(f"vigil operator: {refused}", file=sys.stderr)
            return 2
    webhook = None
    if args.webhook_address:
        if not (args.webhook_cert_file and args.webhook_key_file):
            print("vigil operator: --webhook-address needs --webhook-cert-file and --webhook-key-file", file=sys.stderr)
            return 2
        webhook = (args.webhook_address, args.webhook_cert_file, args.webhook_key_file)
    beat_server = None
    if args.beat_address:
        cert, key = args.beat_cert_file or args.webhook_cert_file, args.beat_key_file or args.webhook_key_file
        if not (cert and key):
            print(
                "vigil operator: --beat-address needs --beat-cert-file and --beat-key-file (or the webhook's, which "
                "it uses when those are not given)",
                file=sys.stderr,
            )
            return 2
        beat_server = (args.beat_address, cert, key)
    beat_channel = None
    if args.heartbeat_url:
        if beat_server is None:
            print(
                "vigil operator: --heartbeat-url needs --beat-address: the HTTPS server the beats are posted to "
                "(behind the Service that selects the leader)",
                file=sys.stderr,
            )
            return 2
        if not args.heartbeat_url.startswith("https://"):
            print(f"vigil operator: --heartbeat-url {args.heartbeat_url!r} must be an https:// URL", file=sys.stderr)
            return 2
        ca_pem = ""  # with self-managed certificates: the CA kept, once read at start
        if args.heartbeat_ca_file:
            try:
                ca_pem = Path(args.heartbeat_ca_file).read_text()
            except (OSError, UnicodeDecodeError) as err:
                print(f"vigil operator: cannot read --heartbeat-ca-file: {err}", file=sys.stderr)
                return 2
        beat_channel = BeatChannel(args.heartbeat_url, ca_pem, args.heartbeat_audience)
    metrics_tls = None
    if args.metrics_address and not args.metrics_insecure:
        if not (args.metrics_cert_file and args.metrics_key_file):
            print(
                "vigil operator: --metrics-address needs --metrics-cert-file and --metrics-key-file (metrics are "
                "served over HTTPS to authorized tokens), or --metrics-insecure for plain HTTP to anyone",
                file=sys.stderr,
            )
            return 2
        metrics_tls = (args.metrics_cert_file, args.metrics_key_file)
    lease = None
    if args.leader_elect:
        try:
            lease = (election_config(args), lease_namespace(args), args.lease_name)
        except InvalidTimings as err:
            print(f"vigil operator: {err}", file=sys.stderr)
            return 2
    try:
        credentials = config.load()
    except config.NoCredentials as err:
        print(f"vigil operator: {err}", file=sys.stderr)
        return 2
    settings = manager.OperatorSettings(
        namespaces=tuple(args.namespace),
        workers=args.workers,
        health_address=args.health_address,
        metrics_address=args.metrics_address,
        metrics_tls=metrics_tls,
        metrics_insecure=args.metrics_insecure,
        webhook=webhook,
        beat_channel=beat_channel,
        agent_image=args.agent_image or None,
        stamp_writes_per_second=args.heartbeat_stamp_writes_per_second,
        beat_server=beat_server,
        beat_connections=args.beat_connections,
        beat_connections_per_source=args.beat_connections_per_source,
        lease=lease,
        pod_watch_pace=args.pod_watch_pace,
        default_queue=default_queue,
        certificates=managed,
    )
    return manager.run_operator(settings, credentials)


def self_managed_certificates(args: argparse.Namespace) -> tuple[Managed | None, str]:
    """--self-managed-certs-secret: the certificates to keep, and the servers' file flags set
    to their files under --cert-dir (given files would be incoherent: refused); or a refusal."""
    from vigil.core.certs import Leaf, Managed, service_names  # cryptography: loaded only for this

    given = [
        flag
        for flag in ("webhook_cert_file", "webhook_key_file", "beat_cert_file", "beat_key_file", "heartbeat_ca_file",
                     "metrics_cert_file", "metrics_key_file")
        if getattr(args, flag)
    ]  # fmt: skip
    if given:
        flags = ", ".join("--" + flag.replace("_", "-") for flag in given)
        return None, f"--self-managed-certs-secret makes the certificates: leave out {flags}"
    namespace = os.environ.get("POD_NAMESPACE", "")
    if not namespace:
        try:
            namespace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
        except OSError:
            namespace = ""
    if not namespace:
        return None, "--self-managed-certs-secret keeps its Secret in $POD_NAMESPACE: set it (the pod's namespace)"
    leaves: list[Leaf] = []
    if args.webhook_address or args.beat_address:
        if not args.webhook_service:
            return None, "--self-managed-certs-secret with --webhook-address or --beat-address needs --webhook-service"
        leaves.append(Leaf("webhook", service_names(args.webhook_service, namespace)))
    if args.metrics_address and not args.metrics_insecure:
        if not args.metrics_service:
            return None, "--self-managed-certs-secret with a secure --metrics-address needs --metrics-service"
        leaves.append(Leaf("metrics", service_names(args.metrics_service, namespace)))
    if args.webhook_configuration and not args.webhook_address:
        return None, "--webhook-configuration needs --webhook-address (the webhook it trusts)"
    managed = Managed(
        secret=args.self_managed_certs_secret,
        namespace=namespace,
        directory=Path(args.cert_dir),
        leaves=tuple(leaves),
        webhook_configuration=args.webhook_configuration or None,
    )
    if args.webhook_address or args.beat_address:
        args.webhook_cert_file, args.webhook_key_file = managed.files("webhook")
    if args.metrics_address and not args.metrics_insecure:
        args.metrics_cert_file, args.metrics_key_file = managed.files("metrics")
    return managed, ""


def _release_finalizers(args: argparse.Namespace) -> int:
    from vigil import finalizers
    from vigil.kube import config
    from vigil.kube.errors import ApiError

    stop = None
    if args.stop_deployment:
        namespace, slash, name = args.stop_deployment.partition("/")
        if not (slash and namespace and name):
            print(
                f"vigil release-finalizers: --stop-deployment takes NAMESPACE/NAME, not {args.stop_deployment!r}",
                file=sys.stderr,
            )
            return 2
        stop = (namespace, name)
    try:
        credentials = config.load()
    except config.NoCredentials as err:
        print(f"vigil release-finalizers: {err}", file=sys.stderr)
        return 2
    try:
        done = finalizers.run(
            credentials, args.namespace, stop_deployment=stop, stop_timeout=args.stop_timeout, dry_run=args.dry_run
        )
    except finalizers.OperatorStillRunning as err:
        print(f"vigil release-finalizers: {err}", file=sys.stderr)
        return 1
    except ApiError as err:
        print(
            f"vigil release-finalizers: {err.verb} {err.resource} failed: {err} (it needs list and patch on pods "
            "in the namespaces given; with --stop-deployment, get deployments, patch deployments/scale and list pods "
            "in its namespace)",
            file=sys.stderr,
        )
        return 1
    verb = "would release" if args.dry_run else "released"
    where = ", ".join(sorted(done.namespaces)) or "-"
    print(f"{verb} {done.pods} pods ({where})")
    return 0


def _migrate_storage(args: argparse.Namespace) -> int:
    from vigil import migration
    from vigil.core.storage import NotReady
    from vigil.kube import config
    from vigil.kube.errors import ApiError

    if not (args.rate > 0 and 1 <= args.page <= 500):
        print("vigil migrate-storage: --rate must be above 0 and --page between 1 and 500", file=sys.stderr)
        return 2
    try:
        credentials = config.load()
    except config.NoCredentials as err:
        print(f"vigil migrate-storage: {err}", file=sys.stderr)
        return 2
    try:
        done = migration.run(credentials, rate=args.rate, page=args.page, dry_run=args.dry_run)
    except (NotReady, migration.MigrationFailed) as err:
        print(f"vigil migrate-storage: {err}", file=sys.stderr)
        return 1
    except ApiError as err:
        print(
            f"vigil migrate-storage: {err} (it needs get and patch on customresourcedefinitions and their status, "
            "list and patch on vigiljobs and vigilqueues in every namespace)",
            file=sys.stderr,
        )
        return 1
    verb = "would rewrite" if args.dry_run else "rewrote"
    counts = ", ".join(f"{done.rewritten.get(plural, 0)} {plural}" for plural, _ in migration.RESOURCES)
    print(f"{verb} {counts}" + ("" if args.dry_run else f"; storedVersions: [{migration.api.VERSION}]"))
    return 0


def default_queue_policy(max_running: int, retry_budget: float | None) -> QueueSpec:
    """The cluster-wide limits of a namespace's `default` queue where no VigilQueue `default`
    exists; a ValueError says which flag is wrong."""
    if not 0 < max_running <= 1_000_000:
        raise ValueError(f"--default-queue-max-running must be between 1 and 1000000, not {max_running}")
    budget = DEFAULT_QUEUE_RETRY_BUDGET if retry_budget is None else retry_budget
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"--default-queue-retry-budget must be between 0 and 1 (1: no budget), not {budget:g}")
    return QueueSpec(max_running=max_running, retry_budget=budget)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vigil", description="Vigil: jobs as pods that stay correct when the network lies."
    )
    parser.add_argument("--version", action="version", version=f"vigil {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    operator = commands.add_parser("operator", help="run the operator against the current kubeconfig")
    operator.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; glob patterns allowed); default: all namespaces",
    )
    operator.add_argument("--workers", type=int, default=4, help="jobs reconciled at once (default 4)")
    operator.add_argument(
        "--pod-watch-pace",
        type=float,
        default=POD_WATCH_PACE_SECONDS,
        metavar="SECONDS",
        help="the pod watches rest this long after each read, so that heartbeats come in batches: less "
        "CPU per beat, a pod's change seen at most this much later; 0 reads every event at once "
        f"(default {POD_WATCH_PACE_SECONDS:g}, at most {MAX_POD_WATCH_PACE_SECONDS:g})",
    )
    operator.add_argument(
        "--default-queue-max-running",
        type=int,
        default=None,
        metavar="N",
        help="in a namespace with no VigilQueue 'default', the jobs that name no queue start at most N "
        "attempts at once, under a retry budget, as if that queue existed (the chart sets 100); "
        "default: none, such jobs run unlimited",
    )
    operator.add_argument(
        "--default-queue-retry-budget",
        type=float,
        default=None,
        metavar="SHARE",
        help="with --default-queue-max-running: retries may be at most this share of those jobs' starts "
        f"over 60 s, as a VigilQueue's retryBudget (default {DEFAULT_QUEUE_RETRY_BUDGET:g}; 1: no budget)",
    )
    operator.add_argument(
        "--health-address",
        metavar="HOST:PORT",
        default=None,
        help="serve http://HOST:PORT/healthz (the process works) and /readyz (every watch has listed "
        "and is fresh) (default: none)",
    )
    operator.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        default=None,
        help="serve Prometheus metrics at https://HOST:PORT/metrics to bearer tokens allowed `get` on the "
        "non-resource URL /metrics (a TokenReview and a SubjectAccessReview; needs --metrics-cert-file and "
        "--metrics-key-file), or with --metrics-insecure at http://HOST:PORT/metrics to anyone (default: none)",
    )
    operator.add_argument("--metrics-cert-file", metavar="FILE", help="the metrics server's TLS certificate (PEM)")
    operator.add_argument("--metrics-key-file", metavar="FILE", help="the metrics server's TLS key (PEM)")
    operator.add_argument(
        "--metrics-insecure",
        action="store_true",
        help="serve /metrics over plain HTTP without authentication: only where no one else can reach "
        "the address (e.g. 127.0.0.1)",
    )
    operator.add_argument(
        "--webhook-address",
        metavar="HOST:PORT",
        default=None,
        help="serve the admission webhook (queue backpressure, maxQueued) over HTTPS at "
        "https://HOST:PORT/validate-vigiljob (default: none; see docs/admission.md)",
    )
    operator.add_argument("--webhook-cert-file", metavar="FILE", help="the webhook's TLS certificate (PEM)")
    operator.add_argument("--webhook-key-file", metavar="FILE", help="the webhook's TLS key (PEM)")
    operator.add_argument(
        "--beat-address",
        metavar="HOST:PORT",
        default=None,
        help=f"serve the agents' beats over HTTPS at https://HOST:PORT{BEAT_PATH}, a port of its own (default: "
        "none; see docs/heartbeats.md)",
    )
    operator.add_argument(
        "--beat-cert-file", metavar="FILE", help="the beat server's TLS certificate (PEM; default: the webhook's)"
    )
    operator.add_argument(
        "--beat-key-file", metavar="FILE", help="the beat server's TLS key (PEM; default: the webhook's)"
    )
    operator.add_argument(
        "--heartbeat-url",
        metavar="URL",
        default=None,
        help=f"where the pods' agents post their beats: the Service in front of --beat-address, {BEAT_PATH} "
        "(default: none, every beat patches its pod; see docs/heartbeats.md)",
    )
    operator.add_argument(
        "--heartbeat-ca-file",
        metavar="FILE",
        help="the CA of the webhook's certificate (PEM), given to the pods to check the leader's",
    )
    operator.add_argument(
        "--self-managed-certs-secret",
        metavar="NAME",
        default=None,
        help="make and keep the servers' TLS certificates in this Secret of $POD_NAMESPACE: a CA, and a "
        "certificate for --webhook-service (webhook and beats) and --metrics-service, renewed 30 days before they "
        "expire; written under --cert-dir for the servers, and the CA into --webhook-configuration's caBundle "
        "(instead of the --*-cert-file, --*-key-file and --heartbeat-ca-file flags; default: none)",
    )
    operator.add_argument(
        "--cert-dir",
        metavar="DIR",
        default="/tmp/vigil-certs",
        help="with --self-managed-certs-secret: where the certificates are written (default: /tmp/vigil-certs)",
    )
    operator.add_argument(
        "--webhook-service", metavar="NAME", help="the Service in front of the webhook and the beats (its names)"
    )
    operator.add_argument("--metrics-service", metavar="NAME", help="the Service in front of /metrics (its names)")
    operator.add_argument(
        "--webhook-configuration",
        metavar="NAME",
        help="the ValidatingWebhookConfiguration whose caBundle is kept the CA (default: none)",
    )
    operator.add_argument(
        "--heartbeat-audience",
        default="vigil.dev",
        help="the audience of the pods' projected tokens for beats (default: vigil.dev)",
    )
    operator.add_argument(
        "--agent-image",
        metavar="IMAGE",
        default=None,
        help="the image of the agent Vigil injects into attempt pods as a native sidecar (heartbeat.agent: "
        "Sidecar), and the default agent of jobs that leave heartbeat.agent unset; the chart passes the "
        "operator's own image (default: none: such jobs run `vigil-agent` from their own image)",
    )
    operator.add_argument(
        "--heartbeat-stamp-writes-per-second",
        type=float,
        metavar="RATE",
        default=STAMP_WRITES_PER_SECOND,
        help="how many jobs' status.currentAttempt.lastHeartbeatAt may be refreshed alone per second, in all: "
        "each job's is refreshed every max(5m, timeout/2, attempts tracked / RATE) seconds, so the column costs "
        f"the API server at most RATE status writes a second at any scale (default: {STAMP_WRITES_PER_SECOND:g})",
    )
    operator.add_argument(
        "--beat-connections",
        type=int,
        metavar="N",
        default=None,
        help="the most connections the beat server holds open: each beating pod keeps one, ~45 KiB each; past it a "
        "beat on a new one is answered 503 with a Retry-After of a few minutes and its agent beats by annotation "
        "meanwhile (default: half the container's memory limit at 64 KiB a connection, within the open-file limit, "
        "at most 65,536)",
    )
    operator.add_argument(
        "--beat-connections-per-source",
        type=int,
        metavar="N",
        default=BEAT_CONNECTIONS_PER_SOURCE,
        help="of those, the most from one address; more are closed before their TLS handshake (default: "
        f"{BEAT_CONNECTIONS_PER_SOURCE}, above the kubelet's default of 110 pods a node, for pods on the node's "
        "network)",
    )
    operator.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    _add_log_format(operator)
    add_election_flags(operator)
    operator.set_defaults(run=_operator)

    release = commands.add_parser(
        "release-finalizers",
        help="remove Vigil's vigil.dev/attempt-tracking finalizer from pods, once no operator runs "
        "(after uninstalling Vigil, or for namespaces no longer watched): nothing is then left Terminating",
        description="Removes Vigil's finalizer from every pod of the namespaces given (default: all) that "
        "carries it. Run it only where no Vigil operator runs any more: a running operator needs the "
        "finalizer to read how a deleted pod ended. The chart runs it as a pre-delete hook.",
    )
    release.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="only this namespace (repeatable; glob patterns allowed, as for `vigil operator`); default: all",
    )
    release.add_argument(
        "--stop-deployment",
        metavar="NAMESPACE/NAME",
        help="first scale the operator's Deployment to 0 and wait until its pods are gone, so that it "
        "creates no pod after the release (a Deployment not found is nothing to stop)",
    )
    release.add_argument(
        "--stop-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the operator's pods to go (default: 120); then exit 1, releasing nothing",
    )
    release.add_argument("--dry-run", action="store_true", help="list the pods, change nothing")
    release.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    _add_log_format(release)
    release.set_defaults(run=_release_finalizers)

    migrate = commands.add_parser(
        "migrate-storage",
        help="after applying this release's CRDs: rewrite every VigilJob and VigilQueue so that etcd stores them as "
        "the current version, then set the CRDs' status.storedVersions to it (docs/upgrading.md)",
        description="Writes every VigilJob and VigilQueue of the cluster once, changing nothing (a patch fenced by "
        "its resourceVersion, paced, conflicts read again), so that the API server stores it as the CRD's storage "
        "version; then sets each CRD's status.storedVersions to that version alone, which a later release needs "
        "before it may stop serving the old one. Safe to run again, and while the operator runs.",
    )
    migrate.add_argument(
        "--rate", type=float, default=20.0, metavar="WRITES", help="writes a second at most (default: 20)"
    )
    migrate.add_argument("--page", type=int, default=100, metavar="N", help="objects a list page (default: 100)")
    migrate.add_argument("--dry-run", action="store_true", help="check the CRDs and list the objects, change nothing")
    migrate.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    _add_log_format(migrate)
    migrate.set_defaults(run=_migrate_storage)

    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    return args.run(args)


def _add_log_format(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--log-format",
        default="text",
        choices=logs.FORMATS,
        help="text (default), for a terminal; or json: one object a line with time, level, logger, message and "
        "the namespace, name, controller and attempt a line is about (the chart's default)",
    )


if __name__ == "__main__":
    sys.exit(main())
