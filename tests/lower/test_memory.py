"""The arena planner never overlaps live buffers and stays near the live-bytes bound."""

from hypothesis import given, settings, strategies as st

from kiln.lower.memory import Lifetime, plan_arena


def _check(buffers, plan, align):
    for a in buffers:
        assert plan.offsets[a.key] % align == 0
        for b in buffers:
            if a.key != b.key and a.overlaps(b):
                oa, ob = plan.offsets[a.key], plan.offsets[b.key]
                assert oa + a.size <= ob or ob + b.size <= oa, (a, b, plan)
    assert plan.lower_bound <= plan.total <= plan.unshared


def test_chain_reuses_memory():
    # a linear chain: each buffer lives for two steps, so two slots suffice
    bufs = [Lifetime(i, 1000, i, i + 1) for i in range(10)]
    plan = plan_arena(bufs, align=64)
    _check(bufs, plan, 64)
    assert plan.total == 2 * 1024
    assert plan.unshared == 10 * 1024


def test_disjoint_lifetimes_share_offset_zero():
    bufs = [Lifetime("a", 512, 0, 1), Lifetime("b", 256, 2, 3)]
    plan = plan_arena(bufs, align=64)
    assert plan.offsets == {"a": 0, "b": 0} and plan.total == 512


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 6)),
                min_size=1, max_size=30),
       st.sampled_from([1, 16, 64]))
def test_random_lifetimes_never_collide(specs, align):
    bufs = [Lifetime(i, size, first, first + span) for i, (size, first, span) in enumerate(specs)]
    plan = plan_arena(bufs, align=align)
    _check(bufs, plan, align)
