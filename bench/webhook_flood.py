"""The admission webhook under a flood of large reviews: how long its event loop is held.

    python bench/webhook_flood.py [--before REV] [--clients 8] [--seconds 8] [--sizes 3,8]

No cluster: the webhook server of this checkout (and, with --before, that of git revision REV,
extracted to a temporary directory, in the same run) serves on loopback in a process of its own,
with a probe in its event loop that sleeps 10 ms over and over and records how late it wakes:
the loop's lag, which is what /healthz, the watches and the Lease renewals wait behind in the
operator. `--clients` HTTPS clients post a review of each size in `--sizes` (MiB; the bulk is an
array of empty objects, the JSON slowest to decode) in a loop for `--seconds`. Printed per code
and size: the answers' statuses, the loop's lag (max, p99, median), the server process's own CPU
seconds and peak RSS, and its parsing child's peak RSS (the new code decodes large bodies there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.webhooks import flood, heavy_review  # noqa: E402
from vigil.servers.webhook import make_self_signed  # noqa: E402

SERVER = r"""
import asyncio, json, statistics, sys, time
from pathlib import Path
from vigil.servers import webhook

def peak_mib(pid="self"):
    # VmHWM, not getrusage's ru_maxrss: that one keeps the forking parent's peak across exec.
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return 0.0

async def main(certs):
    server = webhook.WebhookServer(lambda namespace, queue: (None, 0))
    await server.start("127.0.0.1:0", certs / "tls.crt", certs / "tls.key")
    print(server.port, flush=True)
    stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # until the flood is over
    lags = []
    while not stop.done():
        began = time.monotonic()
        await asyncio.sleep(0.01)
        lags.append((time.monotonic() - began - 0.01) * 1000)
    child = getattr(getattr(server, "skimmer", None), "_proc", None)  # the new code's parsing child
    child_peak = peak_mib(child.pid) if child is not None and child.returncode is None else 0.0
    cpu = time.process_time()
    print(json.dumps({
        "lag_max_ms": max(lags), "lag_p99_ms": statistics.quantiles(lags, n=100)[-1],
        "lag_median_ms": statistics.median(lags), "cpu_s": cpu,
        "rss_max_mib": peak_mib(), "child_rss_max_mib": child_peak,
    }), flush=True)
    await server.stop()

asyncio.run(main(Path(sys.argv[1])))
"""


def run(code: Path, certs: Path, body: bytes, clients: int, seconds: float, scratch: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(certs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=scratch,
    )
    assert server.stdin is not None and server.stdout is not None
    port = int(server.stdout.readline())
    attackers = flood(f"https://127.0.0.1:{port}/validate-vigiljob", certs / "ca.crt", body, clients, seconds, scratch)
    out, _ = attackers.communicate(timeout=seconds + 60)
    server.stdin.write("stop\n")
    server.stdin.flush()
    figures = json.loads(server.stdout.readline())
    server.wait(30)
    return {**figures, "answers": json.loads(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", metavar="REV", help="also measure the webhook of this git revision")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--sizes", default="3,8", help="MiB per review, comma separated (default 3,8)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        certs = scratch / "certs"
        make_self_signed(certs)
        codes = {"this checkout": ROOT / "operator"}
        if args.before:
            archive = scratch / "before.tar"
            subprocess.run(["git", "archive", "-o", str(archive), args.before, "operator"], cwd=ROOT, check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(scratch / "before", filter="data")
            codes = {args.before: scratch / "before" / "operator", **codes}
        for label, code in codes.items():
            for size in (float(s) for s in args.sizes.split(",")):
                body = heavy_review("bench", "batch", int(size * 2**20))
                result = run(code, certs, body, args.clients, args.seconds, scratch)
                print(
                    f"{label}: {args.clients} clients x {size:g} MiB for {args.seconds:g}s: "
                    f"answers {result['answers']}; "
                    f"loop lag max {result['lag_max_ms']:.0f} ms, p99 {result['lag_p99_ms']:.0f} ms, median "
                    f"{result['lag_median_ms']:.1f} ms; loop's CPU {result['cpu_s']:.1f} s; peak RSS "
                    f"{result['rss_max_mib']:.0f} MiB (child {result['child_rss_max_mib']:.0f} MiB)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
