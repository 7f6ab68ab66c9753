"""What the operator keeps of each object, measured: bytes of Python objects per pod and per job,
as the API server sends them and as Vigil keeps them.

    python bench/kept_objects.py                                   # the hostile pod alone
    python bench/kept_objects.py --kubeconfig K --namespace NS     # and every job and pod of NS

No operator runs: each object is parsed from its JSON with orjson, as `vigil.kube.client` does,
N times over (`--copies`, 200), and tracemalloc counts what the copies hold, whole, and after
the transform the operator applies to it as it arrives (`podstate.keep_job_pod` for the pod
watch, `objects.strip_job` for the job watch). A refused pod keeps nothing. The hostile pod is
the one of e2e/test_hostile_pods.py: Vigil's label, 2,500 other labels and a 150 KB
annotation, owned by no VigilJob. Objects read from a cluster (kubectl get -o json) are
reported by kind and phase, as the mean over the objects of each.

docs/capacity-planning.md ("What the operator holds") has the figures and how they add up.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tracemalloc
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from vigil import api  # noqa: E402
from vigil.core.objects import strip_job  # noqa: E402
from vigil.core.podstate import keep_job_pod  # noqa: E402


def hostile_pod() -> dict[str, Any]:
    labels = {f"hostile.example/l{i:04d}": f"0000-{'v' * 27}" for i in range(2500)}
    labels[api.LABEL_JOB_UID] = str(uuid.uuid4())
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "hostile-000",
            "namespace": "tenant",
            "uid": str(uuid.uuid4()),
            "resourceVersion": "1",
            "labels": labels,
            "annotations": {"hostile.example/blob": "x" * 150_000},
        },
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/hostile:none"}]},
        "status": {"phase": "Pending"},
    }


def held(raw: bytes, transform: Callable[[dict], dict | None] | None, copies: int) -> float:
    """Bytes per copy that `copies` parsed (and transformed) copies of `raw` hold."""
    # orjson caches the short keys it decodes, 2,048 at most, process-wide: a constant, not a
    # cost per object (objects of more distinct keys churn it: a few KiB over all the copies).
    orjson.loads(raw)
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    kept = []
    for _ in range(copies):
        obj = orjson.loads(raw)
        kept.append(transform(obj) if transform is not None else obj)
        del obj  # the last copy parsed must not be counted as kept
    size = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    del kept
    return size / copies


def from_cluster(kubeconfig: str, namespace: str) -> list[dict[str, Any]]:
    objects = []
    for resource in ("pods", f"{api.PLURAL}.{api.GROUP}"):
        out = subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, "-n", namespace, "get", resource, "-o", "json"],
            check=True,
            capture_output=True,
        ).stdout
        objects += orjson.loads(out)["items"]
    return objects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--namespace")
    parser.add_argument("--copies", type=int, default=200)
    args = parser.parse_args()

    rows: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    samples = [("hostile pod (2,500 labels, 150 KB annotation, no owner)", hostile_pod())]
    if args.kubeconfig and args.namespace:
        for obj in from_cluster(args.kubeconfig, args.namespace):
            kind = obj.get("kind", "Pod")
            samples.append((f"{kind} {(obj.get('status') or {}).get('phase', '?')}", obj))
    for name, obj in samples:
        raw = orjson.dumps(obj)
        transform = strip_job if "VigilJob" in name else keep_job_pod
        whole = held(raw, None, args.copies)
        kept = held(raw, transform, args.copies)
        rows[name].append((whole, kept, len(raw)))
    print(f"{'object':<60} {'n':>4} {'JSON KiB':>9} {'whole KiB':>10} {'kept KiB':>9}")
    for name, measured in rows.items():
        n = len(measured)
        whole = sum(m[0] for m in measured) / n / 1024
        kept = sum(m[1] for m in measured) / n / 1024
        raw = sum(m[2] for m in measured) / n / 1024
        print(f"{name:<60} {n:>4} {raw:>9.1f} {whole:>10.1f} {kept:>9.2f}")


if __name__ == "__main__":
    main()
