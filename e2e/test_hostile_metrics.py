"""Hostile tenants against the operator's metrics (issue 25, finding 9): /metrics names every
tenant's namespaces and queues, so it is served over HTTPS and only to a bearer token whose user
may `get` the non-resource URL /metrics, as controller-runtime serves its metrics.

Against `vigil operator` as the chart runs it (--metrics-address with a certificate): a scrape
without a token is 401, one with a tenant's token lacking the permission 403, one with a token
bound to a reader role 200; and a flood of made-up tokens costs the API server at most the
review budget (the rest answered 429 without a review), while the scraper whose verdict is
cached keeps getting its metrics.
"""

from __future__ import annotations

import http.client
import ssl
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from tests.support.agents import pod_token
from tests.support.cluster import Kube, free_port, show_log
from tests.support.operators import OperatorProcess
from tests.support.waits import deadline, wait_until
from vigil.core.access import REVIEW_BURST, REVIEWS_PER_SECOND
from vigil.servers.webhook import make_self_signed

pytestmark = pytest.mark.e2e


def scrape(
    port: int, ca: ssl.SSLContext, token: str | None, source: str = "127.0.0.1", accept: str | None = None
) -> tuple[int, str]:
    """One scrape on a new connection from the loopback address `source` (with an `accept` header
    if given); status 0: the server closed the connection before its TLS handshake (past the
    address's share or rate)."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, context=ca, timeout=deadline(10), source_address=(source, 0)
    )
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if accept:
            headers["Accept"] = accept
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode()
    except (ConnectionError, ssl.SSLError) as err:
        return 0, str(err)
    finally:
        connection.close()


@pytest.fixture
def secure_operator(kube: Kube, own_namespace: str, tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext]]:
    """`vigil operator` serving /metrics over HTTPS with authentication, as the chart runs it."""
    ca_pem = make_self_signed(tmp_path / "certs", ip_addresses=("127.0.0.1",))
    ca = ssl.create_default_context(cadata=ca_pem.decode())
    port = free_port()
    operator = OperatorProcess(
        kube,
        [own_namespace],
        tmp_path / "operator.log",
        extra_args=(
            "--metrics-address",
            f"127.0.0.1:{port}",
            "--metrics-cert-file",
            str(tmp_path / "certs" / "tls.crt"),
            "--metrics-key-file",
            str(tmp_path / "certs" / "tls.key"),
        ),
    )
    operator.start()
    try:

        def serving() -> bool:
            return scrape(port, ca, None)[0] != 0

        wait_until(serving, 30, "/metrics to serve over https")
        yield port, ca
    except BaseException:
        show_log(operator.log_path)
        raise
    finally:
        operator.stop()


@pytest.fixture
def tokens(kube: Kube, own_namespace: str) -> Iterator[dict[str, str]]:
    """Tokens of two service accounts: `reader`, bound to a ClusterRole granting get on /metrics
    (as the chart's <fullname>-metrics-reader), and `tenant`, bound to nothing."""
    rbac = client.RbacAuthorizationV1Api(kube.api)
    role = f"{own_namespace}-metrics-reader"
    for account in ("reader", "tenant"):
        kube.core.create_namespaced_service_account(own_namespace, {"metadata": {"name": account}})
    rbac.create_cluster_role(
        {"metadata": {"name": role}, "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": own_namespace}],
        }
    )
    try:
        yield {account: pod_token(kube, own_namespace, None, account=account) for account in ("reader", "tenant")}
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)


def test_metrics_need_a_token_allowed_to_get_them(secure_operator, tokens):
    port, ca = secure_operator
    status, text = scrape(port, ca, None)
    print(f"\nno token: {status} {text.strip()}")
    assert status == 401 and "bearer token" in text
    status, text = scrape(port, ca, "not-a-token")
    assert status == 401, text
    status, text = scrape(port, ca, tokens["tenant"])
    print(f"a tenant's token: {status} {text.strip()}")
    assert status == 403 and "/metrics" in text
    status, text = scrape(port, ca, tokens["reader"])
    print(f"the reader's token: {status}, {len(text.splitlines())} lines")
    assert status == 200 and "leader_election_master_status" in text
    # As Prometheus scrapes when it prefers OpenMetrics: the same answer, strictly parsed.
    status, text = scrape(port, ca, tokens["reader"], accept="application/openmetrics-text;version=1.0.0")
    assert status == 200 and text.endswith("# EOF\n")
    assert "leader_election_master_status" in {family.name for family in parse_openmetrics(text)}


def test_a_flood_of_made_up_tokens_costs_at_most_the_review_budget(secure_operator, tokens):
    port, ca = secure_operator
    assert scrape(port, ca, tokens["reader"])[0] == 200  # its verdict is now cached

    began = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        # From an address of its own, as an attacking pod has: the real scraper's is another.
        flood = list(pool.map(lambda n: scrape(port, ca, f"made-up-{n}", "127.0.0.2")[0], range(100)))
        reader = [status for status, _ in pool.map(lambda _: scrape(port, ca, tokens["reader"]), range(5))]
    elapsed = time.monotonic() - began
    counts = Counter(flood)
    print(f"\n100 made-up tokens in {elapsed:.2f}s: {dict(counts)}; the reader meanwhile: {reader}")
    reviewed = counts[401]  # each 401 of a distinct made-up token is one TokenReview
    assert set(counts) <= {0, 401, 429}, counts  # 0: refused before the handshake, reviewing nothing
    assert reviewed <= REVIEW_BURST + REVIEWS_PER_SECOND * elapsed + 1, counts
    assert counts[429] + counts[0] > 0, "the budget was reached"
    assert reader == [200] * 5, "a scraper whose verdict is cached is never held back"
