"""Round robin over tenants: every key pushed comes out once, FIFO within a tenant, and a key
that becomes ready waits for at most one key of each other tenant, however many they have."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.core.fairness import RoundRobin

pytestmark = pytest.mark.unit

# ("push", tenant) or ("pop", None); keys are numbered as pushed.
steps = st.lists(
    st.one_of(st.tuples(st.just("push"), st.sampled_from("abcd")), st.tuples(st.just("pop"), st.none())),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_every_key_once_fifo_per_tenant_and_no_tenant_served_twice_ahead_of_a_newcomer(script):
    order: RoundRobin[int, str] = RoundRobin()
    tenant_of: dict[int, str] = {}
    waiting: dict[int, Counter] = {}  # key -> other tenants served since it became ready, while its tenant had no other
    ready: list[int] = []
    served: list[int] = []
    for number, (op, tenant) in enumerate(script):
        if op == "push":
            alone = tenant not in {tenant_of[k] for k in ready}
            order.push(tenant, number)
            tenant_of[number] = tenant
            ready.append(number)
            if alone:
                waiting[number] = Counter()
        elif order:
            key = order.pop()
            assert key in ready
            # FIFO within a tenant: no earlier key of its tenant is still ready
            assert not [k for k in ready if tenant_of[k] == tenant_of[key] and k < key]
            ready.remove(key)
            served.append(key)
            waiting.pop(key, None)
            for other, counts in waiting.items():
                counts[tenant_of[key]] += 1
                assert counts[tenant_of[key]] <= 1, f"{tenant_of[key]} served twice ahead of key {other}"
        else:
            with pytest.raises(IndexError):
                order.pop()
        assert len(order) == len(ready) and bool(order) == bool(ready)
    while order:
        served.append(order.pop())
    assert sorted(served) == sorted(tenant_of)


def test_one_key_of_a_quiet_tenant_waits_one_round_behind_ten_thousand_of_a_loud_one():
    order: RoundRobin[tuple[str, int], str] = RoundRobin()
    for i in range(10_000):
        order.push("loud", ("loud", i))
    order.pop()  # the loud tenant's turn is under way
    order.push("quiet", ("quiet", 0))
    taken = [order.pop() for _ in range(2)]
    assert taken == [("loud", 1), ("quiet", 0)]
    assert order.tenants() == 1 and len(order) == 9_998
