"""Block ids → tokens → block hashes: the lazy expansion hashes exactly like the real tokens."""

from __future__ import annotations

import pytest

from lpc.blocks.hashing import BlockHasher
from lpc.traces.expand import SyntheticTokens, expand_requests, synthetic_block_hashes

# Three requests in blocks of 64: b extends a's first two blocks, c shares only block 0.
IDS = [[7, 8, 9], [7, 8, 10, 11], [7, 12]]
INPUTS = [64 * 2 + 5, 64 * 3 + 64, 64 + 30]
OUTPUTS = [20, 0, 70]


def sequences() -> list[SyntheticTokens]:
    return expand_requests(IDS, INPUTS, OUTPUTS, 64)


def test_tokens_follow_the_block_ids() -> None:
    a, b, c = sequences()
    assert len(a) == INPUTS[0] + OUTPUTS[0]
    assert list(a[:128]) == list(b[:128])  # two shared blocks
    assert list(a[128:133]) != list(b[128:133])
    assert list(a[:64]) == list(c[:64]) and list(a[64:94]) != list(c[64:94])
    # Outputs are unique to their request and distinct from every prompt token.
    outputs = [set(s[s.num_prompt_tokens :]) for s in (a, b, c)]
    prompts = set().union(*(set(s[: s.num_prompt_tokens]) for s in (a, b, c)))
    assert not (outputs[0] & outputs[2]) and not (outputs[0] & prompts)
    assert a[3] == list(a)[3] and a[-1] == list(a)[-1]


@pytest.mark.parametrize("block_size", [1, 8, 16, 32, 64])
def test_hashes_equal_hashing_the_expanded_tokens(block_size: int) -> None:
    hasher = BlockHasher(block_size)
    fast = synthetic_block_hashes(sequences(), hasher)
    slow = [hasher.hash_sequence(list(s)) for s in sequences()]
    assert fast == slow


@pytest.mark.parametrize("block_size", [16, 64])
def test_requests_share_exactly_the_blocks_their_ids_share(block_size: int) -> None:
    a, b, c = synthetic_block_hashes(sequences(), BlockHasher(block_size))
    per = 64 // block_size

    def common(x: list, y: list) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), len(x))

    shared_ab, shared_ac = common(a, b), common(a, c)
    assert (shared_ab, shared_ac) == (2 * per, 1 * per)


def test_a_block_size_that_does_not_divide_the_traces_is_refused() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        synthetic_block_hashes(sequences(), BlockHasher(24))
