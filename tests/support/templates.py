"""Pod templates the suites share: a typical one (~1.5 KiB of JSON) and one of many small env
entries, the shape that costs the most memory for its size (the hostile tenant's)."""

from __future__ import annotations

from typing import Any

TYPICAL_TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "ledger", "team": "payments"}, "annotations": {"example.com/owner": "payments"}},
    "spec": {
        "serviceAccountName": "ledger",
        "containers": [
            {
                "name": "main",
                "image": "registry.example.com/payments/ledger:2026.12.01-4f3a2c1",
                "command": ["python", "-m", "ledger.reconcile"],
                "args": ["--date", "2026-12-01", "--region", "eu-west-1", "--batch-size", "500"],
                "env": [{"name": f"LEDGER_SETTING_{i:02d}", "value": f"value-{i}-abcdefghijkl"} for i in range(14)]
                + [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "ledger-db", "key": "password"}}}],
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/ledger", "readOnly": True}],
            }
        ],
        "volumes": [{"name": "config", "configMap": {"name": "ledger-config"}}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
    },
}


def env_template(entries: int) -> dict[str, Any]:
    """A template of many small env entries (the issue's hostile one: 30,000 make 900 KiB)."""
    env = [{"name": f"E{i:05d}", "value": "v" * 8} for i in range(entries)]
    return {"spec": {"containers": [{"name": "main", "image": "registry.example/ledger:1", "env": env}]}}
