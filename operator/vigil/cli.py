"""`vigil`: the command line. `vigil operator` runs the operator against the current kubeconfig."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from vigil import __version__
from vigil.kube.informer import MAX_POD_WATCH_PACE_SECONDS, POD_WATCH_PACE_SECONDS
from vigil.leaderelection import election


def _operator(args: argparse.Namespace) -> int:
    from vigil.manager import OperatorRuntime

    if not 0 <= args.pod_watch_pace <= MAX_POD_WATCH_PACE_SECONDS:
        print(
            f"vigil operator: --pod-watch-pace must be between 0 and {MAX_POD_WATCH_PACE_SECONDS:g} seconds, "
            f"not {args.pod_watch_pace:g}",
            file=sys.stderr,
        )
        return 2
    webhook = None
    if args.webhook_address:
        if not (args.webhook_cert_file and args.webhook_key_file):
            print("vigil operator: --webhook-address needs --webhook-cert-file and --webhook-key-file", file=sys.stderr)
            return 2
        webhook = (args.webhook_address, args.webhook_cert_file, args.webhook_key_file)
    lease = None
    if args.leader_elect:
        try:
            lease = (election.config_from_flags(args), election.lease_namespace(args), args.lease_name)
        except election.ConfigError as err:
            print(f"vigil operator: {err}", file=sys.stderr)
            return 2
    runtime = OperatorRuntime(
        namespaces=args.namespace,
        workers=args.workers,
        health_address=args.health_address,
        webhook=webhook,
        metrics_address=args.metrics_address,
        lease=lease,
        pod_watch_pace=args.pod_watch_pace,
    )

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("vigil").info("received %s: stopping", signal.Signals(signum).name)
        runtime.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runtime.start()
    while not runtime.wait(timeout=0.5):
        pass
    return 1 if runtime.error else 0


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
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: none)",
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
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    election.add_flags(operator)
    operator.set_defaults(run=_operator)

    args = parser.parse_args(argv)
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
