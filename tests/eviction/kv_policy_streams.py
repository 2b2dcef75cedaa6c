"""Random operation streams that drive a fast evictor and its plain reference side by side.

Like `test_cache_references.drive`, plus what the KV-cache policies read: releases carry a
conversation and a category, and some releases are split the way the block manager splits
them: the deeper blocks freed (`push_cached`), the shallower ones still held by another
request (`note_shared_release`, the same `Release` object), released later on their own.
Also a block-manager replay that tags each release with its conversation's turn.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from eviction import Evictor, FreedBlocks, Release
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.test_lpc_reference import hashes_of
from tests.lpc.streams import Allocate
from tests.properties import check_due, exercised


def drive(
    fast: Evictor,
    plain: Evictor,
    seed: int,
    num_blocks: int,
    steps: int = 400,
    categories: Sequence[str | None] = ("chat_1", "chat_2", "file_1", None),
    conversations: Sequence[str | None] = ("c0", "c1", "c2", "c3", None),
    max_step_s: float = 1.0,
    hashes: int = 40,
    check: bool = True,
) -> Counter:
    """Pops compared one by one, sizes at every step; returns counts of what the stream
    exercised. `fast`'s invariants are checked every `CHECK_EVERY` steps and at the end (a
    corrupted structure stays corrupted, and a pop it misorders differs from the reference's
    at once); `check=False` skips them (for a test-made stand-in, not a shipped policy)."""
    rng = random.Random(seed)
    for evictor in (fast, plain):
        evictor.reset(range(num_blocks))
    free = set(range(num_blocks))
    cached: set[int] = set()
    held: list[list[int]] = []  # chains in depth order
    seen = Counter()
    now = 0.0
    for step in range(steps):
        now += rng.random() * max_step_s
        op = rng.random()
        if op < 0.4 and free:
            n = rng.randint(1, min(6, len(free)))
            chain = fast.pop_n(n, now)
            expected = plain.pop_n(n, now)
            assert chain == expected, f"seed {seed} step {step}: {chain} != reference {expected}"
            seen["evictions"] += len(set(chain) & cached)
            free -= set(chain)
            cached -= set(chain)
            held.append(chain)
        elif op < 0.6 and cached & free:
            block = rng.choice(sorted(cached & free))
            fast.remove(block)
            plain.remove(block)
            free.discard(block)
            held.append([block])
            seen["hits"] += 1
        elif held:
            chain = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.15:
                fast.push_uncached(chain)
                plain.push_uncached(chain)
                cached -= set(chain)
                free |= set(chain)
                continue
            release = Release(now, rng.random(), rng.choice(conversations), rng.choice(categories))
            split = rng.randrange(1, len(chain)) if len(chain) > 1 and rng.random() < 0.3 else 0
            shared, freed = chain[:split], chain[split:]
            digests = [
                None if rng.random() < 0.1 else bytes([rng.randrange(hashes)]) for _ in chain
            ]
            depths = list(range(len(chain)))
            part = FreedBlocks(freed[::-1], depths[split:][::-1], digests[split:][::-1])
            fast.push_cached(part, release)
            plain.push_cached(part, release)
            if shared:
                part = FreedBlocks(shared[::-1], depths[:split][::-1], digests[:split][::-1])
                fast.note_shared_release(part, release)
                plain.note_shared_release(part, release)
                held.append(shared)  # another request still holds them
                seen["shared releases"] += 1
            cached |= set(freed)
            free |= set(freed)
        assert len(fast) == len(plain) == len(free), f"seed {seed} step {step}: sizes differ"
        if check and check_due(step):
            fast.check_invariants()
    if check:
        fast.check_invariants()
    assert fast.pop_n(len(free), now) == plain.pop_n(len(free), now)
    return seen


def exercised_enough(seen: Counter) -> None:
    """The stream `drive` returned `seen` for evicted, hit and split enough to compare on (more
    than 30 cached evictions, 10 hits and 5 split releases); a property test discards it if
    not."""
    exercised("evictions", seen["evictions"], 30)
    exercised("hits", seen["hits"], 10)
    exercised("shared releases", seen["shared releases"], 5)


def replay_with_turns(manager: PrefixCacheBlockManager, steps, types: Sequence[str] = ("chat",)):
    """`test_lpc_reference.replay`, each release tagged `<type>_<turn>` (the conversation's
    turn count so far; the type from the conversation's name) as the replay tags them."""
    trace = []
    turns: Counter = Counter()
    conversation_of: dict[str, str] = {}
    for step in steps:
        if isinstance(step, Allocate):
            prefix = manager.find_computed_prefix(step.request, hashes_of(manager, step.request))
            trace.append(manager.allocate(step.request, prefix, step.now_s))
            conv = step.request.conversation_id or step.request.request_id
            conversation_of[step.request.request_id] = conv
        elif step.request_id in manager.active_request_ids():
            conv = conversation_of[step.request_id]
            turns[conv] += 1
            kind = types[sum(map(ord, conv)) % len(types)]
            category = f"{kind}_{min(turns[conv], 3)}"
            manager.free(step.request_id, step.now_s, step.probability, category)
    return trace
