"""What reading a busy watch costs the operator: paced (its pod watches) beside unpaced, one run.

    .venv/bin/python -m bench.watch_reading          # --rate 100 --seconds 20 --rounds 2 [--out DIR]

No cluster: a local HTTPS server (aiohttp, a self-signed certificate from `vigil.servers.webhook`) streams
one watch of pod-sized MODIFIED events (`--event-bytes`, 3,900 by default: a heartbeat's pod event
as measured on the test bed) at `--rate` events a second for `--seconds`. The reader is the
operator's own: `vigil.kube.client.ApiClient.watch` on the operator's event loop (asyncio's), in a
process of its own, so its CPU (getrusage: user + system) is the reading alone,
TLS, HTTP and JSON decoding included, and none of the server's. Each pace is measured in turns,
`--rounds` times, so that a drift of the machine shows as a spread rather than as a difference:

- `0` (the baseline): one read per event as it arrives, how the operator read before and how a
  client without pacing (the official client, kopf) reads;
- `0.1` (`vigil.kube.informer.POD_WATCH_PACE_SECONDS`): the connection rests 0.1 s after each read.

What this leaves out, and bench.heartbeat_load measures: what Vigil does with each event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import results_out
from vigil.kube.informer import POD_WATCH_PACE_SECONDS

PACES = (0.0, POD_WATCH_PACE_SECONDS)


def pod_event(size: int) -> dict:
    """A MODIFIED event of a running attempt's pod, padded to about `size` bytes of JSON."""
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "report-1",
            "namespace": "work",
            "uid": "2d8e4f0c-7a51-4c8e-9d43-0b6a3f1e5c77",
            "resourceVersion": "0",
            "labels": {"vigil.dev/job-uid": "9f1c", "vigil.dev/attempt": "1", "vigil.dev/queue": "default"},
            "annotations": {"vigil.dev/heartbeat": "0", "padding": ""},
            "finalizers": ["vigil.dev/attempt-tracking"],
        },
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/sim"}], "nodeName": "kwok-node-0"},
        "status": {"phase": "Running", "podIP": "10.0.0.7", "startTime": "2026-11-30T23:00:00Z"},
    }
    event = {"type": "MODIFIED", "object": pod}
    pod["metadata"]["annotations"]["padding"] = "x" * max(0, size - len(json.dumps(event)))
    return event


async def serve(rate: float, seconds: float, size: int, certs: Path) -> None:
    """Serve one watch stream, print the port, and exit once it has been streamed."""
    import ssl

    from aiohttp import web

    event = pod_event(size)
    done = asyncio.Event()

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        began = loop.time()
        n = 0
        while n < rate * seconds:
            n += 1
            event["object"]["metadata"]["resourceVersion"] = str(n)
            event["object"]["metadata"]["annotations"]["vigil.dev/heartbeat"] = str(n)
            await response.write(json.dumps(event).encode() + b"\n")
            await asyncio.sleep(max(0.0, began + n / rate - loop.time()))
        done.set()
        return response

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    app = web.Application()
    app.router.add_get("/api/v1/pods", watch)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
    await done.wait()
    await asyncio.sleep(0.5)  # the stream's end reaches the reader before the server goes
    await runner.cleanup()


async def read(port: int, pace: float, certs: Path) -> dict[str, float]:
    """Read the whole stream at `pace`: events, reads, and this process's CPU seconds doing it."""
    from kubernetes import client

    from vigil.kube.client import ApiClient
    from vigil.kube.config import Credentials

    configuration = client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.ssl_ca_cert = str(certs / "ca.crt")
    reader = ApiClient(Credentials(configuration))
    reads, events = -1, 0  # the first on_bytes is the stream being accepted

    def on_bytes() -> None:
        nonlocal reads
        reads += 1

    before, began = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    async for _ in reader.watch("/api/v1/pods", {}, 30, on_bytes, pace):
        events += 1
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - began
    await reader.close()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"events": events, "reads": reads, "seconds": wall, "cpu_seconds": cpu}


def measure(pace: float, args: argparse.Namespace, certs: Path) -> dict[str, float]:
    """One stream read at `pace`, the server and the reader each in a process of its own."""
    command = [sys.executable, "-m", "bench.watch_reading"]
    server = subprocess.Popen(
        [*command, "_serve", str(args.rate), str(args.seconds), str(args.event_bytes), str(certs)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        if not port:
            raise RuntimeError("the bench's HTTPS server did not start (see its output above)")
        out = subprocess.run([*command, "_read", port, str(pace), str(certs)], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"the reader failed: {out.stderr.strip()}")
        figures = json.loads(out.stdout)
    finally:
        server.wait(timeout=30)
    figures["cpu_seconds_per_1000_events"] = figures["cpu_seconds"] / figures["events"] * 1000
    figures["reads_per_second"] = figures["reads"] / figures["seconds"]
    return figures


def report(results: dict[float, list[dict[str, float]]], args: argparse.Namespace) -> str:
    base = min(r["cpu_seconds_per_1000_events"] for r in results[0.0])
    lines = [
        f"Reading one watch of {args.rate:g} pod events a second ({args.event_bytes} bytes each) for "
        f"{args.seconds:g} s over TLS, with vigil.kube.client.ApiClient on the operator's event loop; "
        f"{args.rounds} rounds, the paces taking turns",
        "",
        "| pace, s | reader CPU s per 1,000 events (each round) | reads per second | events | / unpaced |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for pace, runs in results.items():
        each = " / ".join(f"{r['cpu_seconds_per_1000_events']:.3f}" for r in runs)
        reads = sum(r["reads_per_second"] for r in runs) / len(runs)
        against = min(r["cpu_seconds_per_1000_events"] for r in runs) / base
        lines.append(f"| {pace:g} | {each} | {reads:.0f} | {runs[0]['events']} | {against:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:  # the bench's own subprocesses
        rate, seconds, size, certs = argv[1:]
        asyncio.run(serve(float(rate), float(seconds), int(size), Path(certs)))
        return 0
    if argv[:1] == ["_read"]:
        port, pace, certs = argv[1:]
        print(json.dumps(asyncio.run(read(int(port), float(pace), Path(certs)))))
        return 0

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100, help="events a second (default 100)")
    parser.add_argument("--seconds", type=float, default=20, help="length of each stream (default 20)")
    parser.add_argument("--event-bytes", type=int, default=3900, help="size of each event (default 3900)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the paces taking turns (default 2)")
    parser.add_argument("--out", type=Path, help="also write <out>/watch-reading-<UTC>.md and .json")
    args = parser.parse_args(argv)

    from vigil.servers.webhook import make_self_signed

    results: dict[float, list[dict[str, float]]] = {pace: [] for pace in PACES}
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as scratch:
        certs = Path(scratch)
        make_self_signed(certs)
        for round_ in range(1, args.rounds + 1):
            for pace in PACES:
                results[pace].append(measure(pace, args, certs))
                print(f"round {round_}, pace {pace:g}: {results[pace][-1]}", file=sys.stderr)
    text = report(results, args)
    print(text)
    if args.out:
        figures = {**vars(args), "out": str(args.out), "results": {str(k): v for k, v in results.items()}}
        results_out.write(args.out, "watch-reading", text, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
