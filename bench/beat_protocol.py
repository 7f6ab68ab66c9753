"""What a beat costs the server: the heartbeat endpoint on the server's own protocol beside the
same endpoint through aiohttp, one run.

    .venv/bin/python -m bench.beat_protocol     # --connections 1000 --rate 100 --seconds 20 --rounds 2 [--out DIR]

No cluster. The server is the operator's: `vigil.servers.http.serve_fast` over TLS (a
self-signed certificate) serving `vigil.servers.beats.BeatEndpoint`, in a process of its own,
with a key set and `--connections` pods of its own; each connection is one pod beating with its
own projected-style token (RS256, checked once, then remembered as on the bed). Two ways, taking
turns, `--rounds` times, so a drift of the machine shows as a spread:

- `aiohttp` (the baseline): the same handler as an aiohttp route behind the same gate
  (`vigil.servers.http.serve`), as an HTTP framework would answer it;
- `protocol`: the endpoint as a `FastRoute`, answered by the server's protocol itself.

The client holds every connection open and beats at `--rate` a second in all, as agents do; the
server's CPU (utime + stime from /proc) is read over the window alone, after the connections
are made and the tokens verified once, and its resident memory at the window's end (every
connection open). What this leaves out, and bench.heartbeat_load measures:
what the operator does with a beat it counts (its liveness bookkeeping), and the agents' own code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from bench import results_out
from bench.procfs import cpu_seconds
from vigil.servers.http import FastRoute, Reply

MODES = ("aiohttp", "protocol")
NAMESPACE = "bench"
ISSUER = "https://kubernetes.default.svc.cluster.local"


def pod(i: int) -> dict:
    return {"metadata": {"namespace": NAMESPACE, "name": f"beat-{i}", "uid": f"uid-{i}"}}


async def serve(mode: str, connections: int, scratch: Path) -> None:
    """Serve the endpoint (as `mode`), print the port, and run until stdin closes."""
    from prometheus_client import CollectorRegistry, Counter

    from vigil.core import beats
    from vigil.servers.beats import BeatEndpoint, outcome_counter
    from vigil.servers.http import Bounds, serve, serve_fast
    from vigil.servers.tls import server_context

    keys = beats.parse_jwks(ISSUER, (scratch / "jwks.json").read_bytes())
    pods = {f"uid-{i}": pod(i) for i in range(connections)}
    heard = [0]

    async def fetch(_kid: str | None) -> beats.IssuerKeys:
        return keys

    def count_heard(_pod: object) -> None:
        heard[0] += 1

    posts = Counter("posts", "Beats by outcome.", ["outcome"], registry=CollectorRegistry())
    endpoint = BeatEndpoint(
        leading=lambda: True,
        keys=fetch,
        held=lambda: keys,
        pod_of=pods.get,
        heard=count_heard,
        count=outcome_counter(posts),
        # every pod of the bench beats from 127.0.0.1, as the operator's flags let (--beat-connections-per-source)
        budget=beats.VerificationBudget(source_burst=connections),
    )
    (route,) = endpoint.routes()
    bounds = Bounds(max_connections=connections + 16, per_source=connections + 16)
    context = server_context(scratch / "tls.crt", scratch / "tls.key")
    if mode == "protocol":
        server = await serve_fast(route, "127.0.0.1:0", bounds=bounds, ssl_context=context)
    else:
        server = await serve([aiohttp_route(route)], "127.0.0.1:0", bounds=bounds, ssl_context=context)
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # the bench closes it
    await server.stop()


def aiohttp_route(route: FastRoute) -> web.RouteDef:
    """The fast route's handler as an aiohttp route: the baseline."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.content.read(route.max_body + 1)
        answer = route.handler({k.lower(): v for k, v in request.headers.items()}, body, request.remote or "")
        reply = answer if isinstance(answer, Reply) else await answer
        response = web.Response(status=reply.status, body=reply.body, content_type="application/json")
        if reply.close:
            response.force_close()
        return response

    return web.post(route.path, handle)


def rss_mib(pid: int) -> float:
    """The server's resident memory now (VmRSS): its connections' share shows at --connections 10000."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def beat(port: int, pid: int, tokens: list[str], args: argparse.Namespace, scratch: Path) -> dict:
    """Every connection beating at its share of the rate; the server's CPU over the window."""
    from vigil.core import beats

    context = ssl.create_default_context(cafile=str(scratch / "ca.crt"))
    loop = asyncio.get_running_loop()
    period = len(tokens) / args.rate
    answered, failed = [0], [0]
    measuring = asyncio.Event()
    stop = asyncio.Event()

    async def one(i: int, token: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        body = json.dumps({"namespace": NAMESPACE, "name": f"beat-{i}", "uid": f"uid-{i}", "beat": "1:bench"}).encode()
        request = (
            f"POST {beats.PATH} HTTP/1.1\r\nHost: vigil\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        try:
            await exchange(reader, writer, request)  # the token verified once, before the window
            await asyncio.sleep((i / len(tokens)) * period)
            while not stop.is_set():
                ok = await exchange(reader, writer, request)
                if measuring.is_set():
                    answered[0] += ok
                    failed[0] += not ok
                await asyncio.sleep(period)
        finally:
            writer.close()

    tasks = [asyncio.create_task(one(i, token)) for i, token in enumerate(tokens)]
    await asyncio.sleep(period + 2)  # every connection made and beating
    began, before = loop.time(), cpu_seconds(pid)
    measuring.set()
    await asyncio.sleep(args.seconds)
    measuring.clear()
    cpu, seconds = cpu_seconds(pid) - before, loop.time() - began
    rss = rss_mib(pid)  # every connection open and beating
    stop.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    broken = [repr(o) for o in outcomes if isinstance(o, BaseException)]  # a connection that died is a failure too
    return {
        "beats": answered[0],
        "failed": failed[0] + len(broken),
        "broken": broken[:5],
        "seconds": seconds,
        "server_cpu_seconds": cpu,
        "server_rss_mib": rss,
    }


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bool:
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lengths = (line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    length = int(next(lengths))
    answer = await reader.readexactly(length)
    return head.startswith(b"HTTP/1.1 200") and b"Renewed" in answer


def measure(mode: str, args: argparse.Namespace, tokens: list[str], scratch: Path) -> dict:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.beat_protocol", "_serve", mode, str(args.connections), str(scratch)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        port = server.stdout.readline().strip()
        if not port:
            raise RuntimeError("the bench's server did not start (see its output above)")
        figures = asyncio.run(beat(int(port), server.pid, tokens, args, scratch))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
    figures["server_cpu_ms_per_beat"] = figures["server_cpu_seconds"] / max(1, figures["beats"]) * 1000
    return figures


def keys_and_tokens(connections: int, scratch: Path) -> list[str]:
    """A key set (written to jwks.json for the server) and one token per pod, signed by it."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    from vigil.core import beats

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    entry = json.loads(jwt.get_algorithm_by_name("RS256").to_jwk(key.public_key()))
    (scratch / "jwks.json").write_text(json.dumps({"keys": [{**entry, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    now = int(time.time())
    tokens = []
    for i in range(connections):
        claims = {
            "iss": ISSUER,
            "aud": [beats.AUDIENCE],
            "sub": f"system:serviceaccount:{NAMESPACE}:default",
            "exp": now + 3600,
            "iat": now - 10,
            "nbf": now - 10,
            "kubernetes.io": {
                "namespace": NAMESPACE,
                "pod": {"name": f"beat-{i}", "uid": f"uid-{i}"},
                "serviceaccount": {"name": "default", "uid": "sa-uid"},
            },
        }
        tokens.append(jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"}))
    return tokens


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    base = min(r["server_cpu_ms_per_beat"] for r in results["aiohttp"])
    lines = [
        f"The heartbeat endpoint on the beat server (TLS): {args.connections} kept-alive connections "
        f"(one pod each) beating {args.rate:g} a second in all, {args.seconds:g} s a window; "
        f"{args.rounds} rounds, the two ways taking turns",
        "",
        "| served by | server CPU ms per beat (each round) | beats answered Renewed | failed | / aiohttp "
        "| server RSS, MiB (largest round) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode, runs in results.items():
        each = " / ".join(f"{r['server_cpu_ms_per_beat']:.3f}" for r in runs)
        against = min(r["server_cpu_ms_per_beat"] for r in runs) / base
        beats_, failed = sum(r["beats"] for r in runs), sum(r["failed"] for r in runs)
        rss = max(r["server_rss_mib"] for r in runs)
        lines.append(f"| {mode} | {each} | {beats_} | {failed} | {against:.2f} | {rss:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:  # the bench's own subprocess
        mode, connections, scratch = argv[1:]
        asyncio.run(serve(mode, int(connections), Path(scratch)))
        return 0

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000, help="pods beating, one connection each")
    parser.add_argument("--rate", type=float, default=100, help="beats a second in all (default 100)")
    parser.add_argument("--seconds", type=float, default=20, help="length of each window (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the two ways taking turns (default 2)")
    parser.add_argument("--out", type=Path, help="also write <out>/beat-protocol-<UTC>.md and .json")
    args = parser.parse_args(argv)

    from vigil.servers.webhook import make_self_signed

    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as scratch:
        make_self_signed(scratch)
        tokens = keys_and_tokens(args.connections, Path(scratch))
        for round_ in range(1, args.rounds + 1):
            for mode in MODES:
                results[mode].append(measure(mode, args, tokens, Path(scratch)))
                print(f"round {round_}, {mode}: {results[mode][-1]}", file=sys.stderr)
    text = report(results, args)
    print(text)
    if args.out:
        results_out.write(args.out, "beat-protocol", text, {**vars(args), "out": str(args.out), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
