"""The webhook's parsing child: `python -m vigil.servers.skim_child`, started and fed by
`vigil.servers.webhook.Skimmer`.

Decoding a large review holds the GIL for as long as it takes (0.5 s for 3 MiB of small objects on
the bed), so a thread would not free the operator's event loop; a process does. This one reads
frames from stdin (a 4-byte big-endian length, then that many bytes of review) and answers each
with a frame of JSON: {"fields": what `vigil.core.reviewbody.skim` kept} or {"error": why the body
is not JSON}. It imports nothing of Vigil but that module (about 10 MiB of memory; the decode of a
hostile 3 MiB body peaks near 90 MiB and is given back), and it ends at the end of its input,
so it never outlives the operator.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import BinaryIO

from vigil.core.reviewbody import NotJson, skim

HEADER = struct.Struct(">I")


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame's payload, or None at the end of the input."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    payload = stream.read(size)
    return payload if len(payload) == size else None


def write_frame(stream: BinaryIO, payload: bytes) -> None:
    stream.write(HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def answer(body: bytes) -> bytes:
    try:
        return json.dumps({"fields": skim(body)}).encode()
    except NotJson as err:
        return json.dumps({"error": str(err)}).encode()


def main() -> None:
    # The operator's event loop (Lease renewals, watches, probes) must not wait for the CPU behind a
    # decode that only a review, answerable within 5 s or admitted by failurePolicy, waits for.
    os.nice(10)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while (body := read_frame(source)) is not None:
        write_frame(sink, answer(body))


if __name__ == "__main__":
    main()
