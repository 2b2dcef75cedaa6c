"""Block hash ids → the token sequences the block manager replays, without materialising them.

Each id is expanded into `trace_block_size` synthetic tokens of its dense id, so equal ids
share all their tokens and different ids none (docs/traces.md, "From block ids to tokens").
When the ids cover the output too (`covers_output`: a request log's `sequence_hash_ids`, where
the engine hashed the reply's blocks, which the next turn's prompt repeats), every token comes
from its block's id alike; otherwise output tokens are unique to their request. `SyntheticTokens`
is a lazy `Sequence[int]` holding the ids; `synthetic_block_hashes` hashes each (parent, block
id) once for the whole trace with the block manager's own `BlockHasher`, the same hashes as
`BlockHasher.hash_sequence(list(tokens))` (a test checks).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from lpc.blocks.hashing import BlockHash, BlockHasher
from lpc.errors import InvalidInputError


class SyntheticTokens(Sequence[int]):
    """The prompt and output tokens of one trace request, computed on access."""

    __slots__ = (
        "block_ids",
        "covers_output",
        "num_output_tokens",
        "num_prompt_tokens",
        "output_base",
        "trace_block_size",
    )

    def __init__(
        self,
        block_ids: array,
        trace_block_size: int,
        num_prompt_tokens: int,
        num_output_tokens: int,
        output_base: int,
        covers_output: bool = False,
    ) -> None:
        covered = num_prompt_tokens + (num_output_tokens if covers_output else 0)
        if len(block_ids) != -(-covered // trace_block_size):
            raise ValueError(
                f"{len(block_ids)} block ids for {covered} tokens in blocks of {trace_block_size}"
            )
        self.block_ids = block_ids  # dense ids, one per trace block of the prompt (or sequence)
        self.covers_output = covers_output
        self.trace_block_size = trace_block_size
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.output_base = output_base  # the first output token's id

    def __len__(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_covered_tokens(self) -> int:
        """The tokens the block ids stand for (prompt, or prompt and output)."""
        return self.num_prompt_tokens + (self.num_output_tokens if self.covers_output else 0)

    def _values(self, start: int, stop: int) -> np.ndarray:
        positions = np.arange(start, stop, dtype=np.int64)
        prompt = positions < self.num_covered_tokens
        bs = self.trace_block_size
        ids = np.frombuffer(self.block_ids, dtype=np.uint32).astype(np.int64)
        out = np.empty(len(positions), dtype=np.int64)
        p = positions[prompt]
        out[prompt] = ids[p // bs] * bs + p % bs
        out[~prompt] = self.output_base + positions[~prompt] - self.num_prompt_tokens
        return out

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> array: ...
    def __getitem__(self, index: int | slice) -> int | array:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            values = self._values(start, max(start, stop))[::step]
            return array("q", values.tobytes())
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("token index out of range")
        return int(self._values(index, index + 1)[0])

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SyntheticTokens):
            return (
                self.trace_block_size == other.trace_block_size
                and self.num_prompt_tokens == other.num_prompt_tokens
                and self.num_output_tokens == other.num_output_tokens
                and self.output_base == other.output_base
                and self.covers_output == other.covers_output
                and self.block_ids == other.block_ids
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class DenseIds:
    """Renumbers block ids 0, 1, 2, … in order of first appearance (stable for a trace)."""

    def __init__(self) -> None:
        self._dense: dict[int, int] = {}

    def map(self, ids: Sequence[int]) -> array:
        dense = self._dense
        return array("I", [dense.setdefault(h, len(dense)) for h in ids])

    def __len__(self) -> int:
        return len(self._dense)


def expand_requests(
    hash_ids: Sequence[Sequence[int]],
    input_lengths: Sequence[int],
    output_lengths: Sequence[int],
    trace_block_size: int,
    covers_output: Sequence[bool] | None = None,
) -> list[SyntheticTokens]:
    """Token sequences of requests given in replay order (the order fixes the numbering).

    `covers_output[i]`: request i's ids cover its output too (default: the prompt only).
    """
    dense = DenseIds()
    mapped = [dense.map(ids) for ids in hash_ids]
    output_base = len(dense) * trace_block_size
    covers = covers_output if covers_output is not None else [False] * len(mapped)
    tokens = []
    for ids, num_prompt, num_output, covered in zip(
        mapped, input_lengths, output_lengths, covers, strict=True
    ):
        tokens.append(
            SyntheticTokens(ids, trace_block_size, num_prompt, num_output, output_base, covered)
        )
        if not covered:
            output_base += num_output
    return tokens


def check_block_size(block_size: int, trace_block_size: int) -> None:
    if trace_block_size % block_size:
        raise InvalidInputError(
            f"--block-size {block_size} does not divide the trace's block size "
            f"{trace_block_size}: blocks would straddle two trace blocks (use a divisor, "
            f"e.g. {trace_block_size} or 16)"
        )


def synthetic_block_hashes(
    sequences: Sequence[SyntheticTokens], hasher: BlockHasher
) -> list[list[BlockHash]]:
    """Every request's full-block hash chain, as `hasher.hash_sequence` would compute it.

    The prompt's full blocks come from a table keyed by (parent hash, block id), filled once
    per distinct trace block; only the blocks that reach into the output are hashed per
    request (they hold that request's own output tokens).
    """
    bs = hasher.block_size
    done: dict[tuple[BlockHash | None, int], list[BlockHash]] = {}
    out: list[list[BlockHash]] = []
    for tokens in sequences:
        trace_bs = tokens.trace_block_size
        check_block_size(bs, trace_bs)
        per_block = trace_bs // bs
        full_in_prompt = tokens.num_covered_tokens // bs
        hashes: list[BlockHash] = []
        parent: BlockHash | None = None
        for k, block_id in enumerate(tokens.block_ids):
            needed = min(per_block, full_in_prompt - k * per_block)
            if needed <= 0:
                break
            key = (parent, block_id)
            subs = done.get(key)
            if subs is None or len(subs) < needed:
                subs = _hash_trace_block(hasher, parent, block_id, trace_bs, subs or [], needed)
                done[key] = subs
            hashes.extend(subs[:needed])
            if needed < per_block:
                break
            parent = subs[-1]
        if len(tokens) // bs > len(hashes):
            hashes = hasher.hash_sequence(tokens, start_hashes=hashes)
        out.append(hashes)
    return out


def _hash_trace_block(
    hasher: BlockHasher,
    parent: BlockHash | None,
    block_id: int,
    trace_block_size: int,
    known: list[BlockHash],
    needed: int,
) -> list[BlockHash]:
    """The first `needed` sub-block hashes of one trace block, extending `known`."""
    bs = hasher.block_size
    values = np.arange(trace_block_size, dtype="<i8") + block_id * trace_block_size
    data = values.tobytes()
    width = 8 * bs
    previous = known[-1] if known else parent
    return [
        *known,
        *hasher.chain_blocks(previous, data[len(known) * width : needed * width], width),
    ]
