"""What the property tests share: the seeds of their random streams, how many examples they
run, and how they discard a stream that did not reach what the test is about.

The streams are functions of a `random.Random` seed (tests/lpc/streams.py,
tests/eviction/kv_policy_streams.py, lpc.difftest.streams), so Hypothesis draws the seed.
Which seeds, and in which order, comes from the profile registered in tests/conftest.py
(reproducible by default).
"""

from __future__ import annotations

import os

from hypothesis import Phase, assume, event, settings
from hypothesis import strategies as st

SEEDS = st.integers(0, 2**32 - 1)

# How often a random stream checks the structures' own invariants (`check_invariants`: for
# most policies a copy of the evictor and a dry run of its whole eviction order, most of a
# stream's time when run at every step), besides once at the end. A corrupted structure stays
# corrupted until a check meets it (tests/eviction/test_invariant_checks.py breaks each one),
# and what a stream compares at every step (pops, sizes, membership) is still compared there.
CHECK_EVERY = 10


def check_due(step: int) -> bool:
    """Whether step `step` (from 0) of a stream checks the invariants."""
    return step % CHECK_EVERY == CHECK_EVERY - 1


def examples(n: int) -> settings:
    """`n` examples, no deadline; `LPC_HYPOTHESIS_SCALE=k` runs k times as many (a longer
    search, with `HYPOTHESIS_PROFILE=explore` for examples not run before). No shrinking: a
    smaller seed is no simpler stream, and shrinking a failing comparison replayed it for
    minutes to report seed 0."""
    scale = int(os.environ.get("LPC_HYPOTHESIS_SCALE", "1"))
    if scale < 1:
        raise ValueError(f"LPC_HYPOTHESIS_SCALE must be an int >= 1, not {scale}")
    return settings(max_examples=n * scale, deadline=None, phases=(Phase.explicit, Phase.generate))


def exercised(what: str, count: int, more_than: int) -> None:
    """A stream that reached `what` `more_than` times or fewer proves little about it: the
    example is discarded (after its comparisons ran: a difference still fails). If every
    stream is discarded the test fails (Hypothesis: unsatisfiable), and so it does when 50 are
    before 10 are kept (health check `filter_too_much`): the comparison must stay non-trivial.
    The count is reported in Hypothesis's statistics (`--hypothesis-show-statistics`)."""
    event(f"{what} > {more_than}", str(count > more_than))
    assume(count > more_than)
