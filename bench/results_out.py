"""Where a bench's `--out` goes: `<out>/<name>-<UTC>.md` (the table) and `.json` (every figure)."""

from __future__ import annotations

import json
import time
from pathlib import Path


def write(out: Path, name: str, text: str, figures: dict) -> Path:
    """Write the table and the figures side by side; the JSON's path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-{stamp}.md").write_text(text + "\n")
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps(figures, indent=1) + "\n")
    return path
