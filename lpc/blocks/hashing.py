"""Block hashes for prefix caching: H(parent hash, token ids of the block, extra keys).

Hashes must be stable across processes, so a trace replayed tomorrow or on another machine
gives the same hashes: we hash a canonical byte encoding (never Python's salted `hash()`).
`sha256` is collision resistant and the default; `xxh3_128` is several times faster and fine
when all requests come from one trust domain.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NewType

BlockHash = NewType("BlockHash", bytes)


def _sha256() -> Callable[[bytes], bytes]:
    return lambda data: hashlib.sha256(data).digest()


def _xxh3_128() -> Callable[[bytes], bytes]:
    # Imported when chosen: the vLLM plugin's shadow caches use this package inside vLLM's
    # own venv, which has no xxhash.
    import xxhash

    return xxhash.xxh3_128_digest


# Name -> a factory of the digest function.
HASH_ALGORITHMS: dict[str, Callable[[], Callable[[bytes], bytes]]] = {
    "sha256": _sha256,
    "xxh3_128": _xxh3_128,
}
_ROOT_SEED = b"lpc-prefix-cache-root-v1"


@dataclass(frozen=True, slots=True)
class MultiModalSpan:
    """A multimodal input occupying token positions [offset, offset + length)."""

    identifier: str
    offset: int
    length: int


def encode_tokens(token_ids: Sequence[int], what: str = "token_ids", offset: int = 0) -> bytes:
    """Token ids as little-endian int64, rejecting anything that is not a non-negative int.

    Errors name the position as `what[offset + i]` (`offset`: where this slice starts).
    """
    try:
        packed = array("q", token_ids)
    except (TypeError, OverflowError):
        for i, token in enumerate(token_ids):
            if isinstance(token, bool) or not isinstance(token, int):
                raise TypeError(
                    f"{what}[{offset + i}] must be an int, got {type(token).__name__} {token!r}"
                ) from None
            if not -(2**63) <= token < 2**63:
                message = f"{what}[{offset + i}] = {token} does not fit in 64 bits"
                raise ValueError(message) from None
        raise
    if packed and min(packed) < 0:
        i = next(i for i, t in enumerate(packed) if t < 0)
        raise ValueError(f"{what}[{offset + i}] = {packed[i]} is negative; token ids are >= 0")
    if sys.byteorder != "little":  # pragma: no cover - the encoding is fixed little-endian
        packed.byteswap()
    return packed.tobytes()


def _encode_extra(extra_keys: tuple[Any, ...] | None) -> bytes:
    if not extra_keys:
        return b""
    return json.dumps(extra_keys, separators=(",", ":"), ensure_ascii=False).encode()


class BlockHasher:
    """Chains block hashes over a token sequence with a fixed, documented encoding."""

    def __init__(self, block_size: int, algorithm: str = "sha256") -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        try:
            make_digest = HASH_ALGORITHMS[algorithm]
        except KeyError:
            known = ", ".join(sorted(HASH_ALGORITHMS))
            raise ValueError(f"unknown hash algorithm {algorithm!r}; known: {known}") from None
        self._digest = make_digest()
        self.block_size = block_size
        self.algorithm = algorithm
        self.root = BlockHash(self._digest(_ROOT_SEED + algorithm.encode()))

    def hash_block(
        self, parent: bytes | None, block_tokens: bytes, extra_keys: tuple[Any, ...] | None
    ) -> BlockHash:
        """H(parent, tokens, extras) over `parent || len(tokens) || tokens || extras`."""
        parent = parent if parent is not None else self.root
        body = len(block_tokens).to_bytes(4, "little") + block_tokens
        return BlockHash(self._digest(parent + body + _encode_extra(extra_keys)))

    def chain_blocks(self, parent: bytes | None, data: bytes, width: int) -> list[BlockHash]:
        """`hash_block` of each `width`-byte block of `data` without extra keys, each chained
        to the one before (the first to `parent`): the same bytes, no calls per block."""
        digest = self._digest
        length = width.to_bytes(4, "little")  # no extra keys encode as b""
        head = parent if parent is not None else self.root
        hashes: list[BlockHash] = []
        for offset in range(0, len(data) - width + 1, width):
            head = digest(head + length + data[offset : offset + width])
            hashes.append(BlockHash(head))
        return hashes

    def extra_keys(
        self,
        start: int,
        end: int,
        cache_salt: str | None,
        lora_id: str | int | None,
        mm_spans: Sequence[MultiModalSpan],
    ) -> tuple[Any, ...] | None:
        """Keys that make a block unique beyond its tokens, as vLLM defines them."""
        keys: list[Any] = []
        if lora_id is not None:
            keys.append(("lora", lora_id))
        for span in mm_spans:
            if span.offset < end and start < span.offset + span.length:
                keys.append(("mm", span.identifier, span.offset - start))
        if start == 0 and cache_salt:
            keys.append(("cache_salt", cache_salt))
        return tuple(keys) if keys else None

    def hash_sequence(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None = None,
        lora_id: str | int | None = None,
        mm_spans: Sequence[MultiModalSpan] = (),
        start_hashes: Sequence[BlockHash] = (),
    ) -> list[BlockHash]:
        """Hashes of every full block of `token_ids`.

        `start_hashes` may hold the already known hashes of a prefix of the same request
        (e.g. the previous turn of a conversation), which are reused, not recomputed.
        """
        bs = self.block_size
        num_full = len(token_ids) // bs
        hashes: list[BlockHash] = list(start_hashes[:num_full])
        first = len(hashes)
        # Only tokens not covered by `start_hashes` are encoded (and so validated), including
        # the partial last block, which is validated but not hashed.
        data = encode_tokens(token_ids[first * bs :], offset=first * bs)
        width = 8 * bs
        parent = hashes[-1] if hashes else None
        i = first
        # Every block with extra keys (a LoRA, images, the salt on block 0) one at a time ...
        while i < num_full and (lora_id is not None or mm_spans or (i == 0 and cache_salt)):
            offset = (i - first) * width
            extra = self.extra_keys(i * bs, (i + 1) * bs, cache_salt, lora_id, mm_spans)
            parent = self.hash_block(parent, data[offset : offset + width], extra)
            hashes.append(parent)
            i += 1
        # ... then the plain ones as one chain.
        hashes.extend(
            self.chain_blocks(parent, data[(i - first) * width : (num_full - first) * width], width)
        )
        return hashes
