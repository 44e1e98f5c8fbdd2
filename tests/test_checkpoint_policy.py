"""The checkpoint budget's bookkeeping: what the packs hold, kept as they come and go."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sea.checkpoint import Budget, CheckpointPolicy, CopyCost
from sea.config import Checkpoints

KEYS = st.sampled_from("abcdef")
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("decide"), KEYS, st.floats(0.5, 5.0), st.integers(10**5, 10**7)),
        st.tuples(st.just("committed"), KEYS, st.integers(10**5, 10**7)),
        st.tuples(st.just("known_pack"), KEYS, st.integers(10**5, 10**7)),
        st.tuples(st.just("drop"), KEYS),
        st.tuples(st.just("forget"), KEYS),
        st.tuples(st.just("abandoned"), KEYS),
        st.tuples(st.just("failed"), KEYS),
        st.tuples(st.just("trim"), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_what_the_packs_hold_is_the_sum_of_the_packs_whatever_happens_to_them(steps):
    """``held_bytes`` is asked after every node, so it is a running total, not a sum over the
    packs: whatever comes and goes (decided, resized once home, dropped, replaced, trimmed,
    abandoned, an earlier run's), it is the sum."""
    policy = CheckpointPolicy(Checkpoints.AUTO, CopyCost(per_file=0.01, per_byte=1e-8), budget=Budget("15MB"))
    for step in steps:
        match step:
            case ("decide", key, seconds, nbytes):
                policy.decide(key, seconds=seconds, files=3, nbytes=nbytes, producers=[])
            case ("committed", key, nbytes):
                policy.committed(key, nbytes)
            case ("known_pack", key, nbytes):
                policy.known_pack(key, nbytes, seconds=1.0)
            case ("trim", final):
                policy.trim(final)
            case ("failed", key):
                policy.failed(key, "a copy failed")
            case (name, key):
                getattr(policy, name)(key)
        assert policy.held_bytes() == sum(h.nbytes for h in policy._held.values())
