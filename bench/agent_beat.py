"""What a beat costs the agent: its leader channel (`vigil.agent.channel.LeaderBeat`, a blocking
keep-alive TLS socket, the answer parsed by httptools) beside the aiohttp client it replaced, one
run.

    .venv/bin/python -m bench.agent_beat     # --pods 100 --beats 10 --rounds 2 [--out DIR]

No cluster. The server is bench.beat_protocol's (the operator's endpoint on its own protocol, in
a process of its own); `--pods` channels, one per pod, each with its own token, beat in turn from
one thread, `--beats` times each, after one beat apiece that opens the connections and has the
tokens verified. The client's CPU (process time) over those beats is the agent's cost of a beat;
the two ways take turns `--rounds` times. Every beat must be answered Renewed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import results_out
from bench.beat_protocol import keys_and_tokens
from vigil.agent.channel import MAX_ANSWER_BYTES, LeaderAnswer, LeaderBeat, fallback, leader_outcome
from vigil.core import beats
from vigil.core.fencing import Observed

MODES = ("aiohttp", "socket")


class AiohttpLeaderBeat(LeaderBeat):
    """The baseline: the agent's channel as it was before (an aiohttp session on an event loop of
    the calling thread, one keep-alive connection), kept here only to be measured."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loop = asyncio.new_event_loop()
        self.session: aiohttp.ClientSession | None = None

    async def _aio_post(self, body: dict[str, str], token: str) -> LeaderAnswer:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ssl, limit=1),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
        headers = {"Authorization": f"Bearer {token}", "User-Agent": self.user_agent, "Accept": "application/json"}
        async with self.session.post(self.url, json=body, headers=headers) as resp:
            answer = await resp.content.read(MAX_ANSWER_BYTES + 1)
            if len(answer) > MAX_ANSWER_BYTES:
                return fallback("too large")
            return leader_outcome(resp.status, answer)

    def post(self, beat: str) -> LeaderAnswer:
        from vigil.agent.channel import beat_body, read_token

        body = beat_body(self.namespace, self.name, self.uid, beat)
        coro = asyncio.wait_for(self._aio_post(body, read_token(self.token_file)), self.timeout)
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        if self.session is not None:
            self.loop.run_until_complete(self.session.close())
        self.loop.close()


def measure(mode: str, port: int, scratch: Path, args: argparse.Namespace) -> dict:
    cls = AiohttpLeaderBeat if mode == "aiohttp" else LeaderBeat
    ca = (scratch / "ca.crt").read_text()
    url = f"https://127.0.0.1:{port}{beats.PATH}"
    channels = [
        cls(url, ca, str(scratch / f"token-{i}"), namespace="bench", name=f"beat-{i}", uid=f"uid-{i}", timeout=5)
        for i in range(args.pods)
    ]
    try:
        refused = sum(c.post("1:bench").observed is not Observed.RENEWED for c in channels)
        cpu, wall = time.process_time(), time.monotonic()
        for round_ in range(args.beats):
            refused += sum(c.post(f"{round_ + 2}:bench").observed is not Observed.RENEWED for c in channels)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    finally:
        for c in channels:
            c.close()
    n = args.pods * args.beats
    return {
        "beats": n,
        "refused": refused,
        "client_cpu_ms_per_beat": cpu / n * 1000,
        "wall_ms_per_beat": wall / n * 1000,
    }


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    lines = [
        f"agent's side of a beat: {args.pods} pods x {args.beats} beats from one thread, {args.rounds} rounds",
        "",
        "| client | beats | refused | client CPU ms/beat | wall ms/beat |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        for run in results[mode]:
            lines.append(
                f"| {mode} | {run['beats']} | {run['refused']} | {run['client_cpu_ms_per_beat']:.3f} "
                f"| {run['wall_ms_per_beat']:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100, help="channels, one connection each (default 100)")
    parser.add_argument("--beats", type=int, default=10, help="beats per pod measured (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the two ways taking turns (default 2)")
    parser.add_argument("--out", type=Path, help="also write <out>/agent-beat-<UTC>.md and .json")
    args = parser.parse_args(argv)

    from vigil.servers.webhook import make_self_signed

    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        make_self_signed(scratch)
        for i, token in enumerate(keys_and_tokens(args.pods, scratch)):
            (scratch / f"token-{i}").write_text(token)
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.beat_protocol", "_serve", "protocol", str(args.pods), str(scratch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert server.stdout is not None and server.stdin is not None
            port = server.stdout.readline().strip()
            if not port:
                raise RuntimeError("the bench's server did not start (see its output above)")
            for round_ in range(1, args.rounds + 1):
                for mode in MODES:
                    results[mode].append(measure(mode, int(port), scratch, args))
                    print(f"round {round_}, {mode}: {results[mode][-1]}", file=sys.stderr)
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(timeout=30)
    text = report(results, args)
    print(text)
    if args.out:
        results_out.write(args.out, "agent-beat", text, {**vars(args), "out": str(args.out), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
