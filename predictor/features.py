"""The predictor's input: a conversation window, the text the embedder sees, the turn scalar.

The LPC paper's predictor input (docs/predictor.md, "Features"): the last N+1 user prompts
under a 512-token budget counted in the embedder's own tokenizer, cut head and tail, joined
oldest first, with the turn count as log(1 + turns); `share_policy`, `window_encoding` and
`turn_count_encoding` hold the options that are not the paper's rule.

The rules, with the edge cases the paper leaves open decided here: docs/design.md, "The
predictor's window".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import numpy as np

from predictor.embedders.base import EmbedderTokenizer
from predictor.errors import UserError

FEATURE_RULES_VERSION = 1
SHARE_POLICIES = ("even", "redistribute")
TURN_COUNT_ENCODINGS = ("log1p", "raw")
WINDOW_ENCODINGS = ("joined", "prompt_mean")
# Fields added after the first release enter the fingerprint only when set away from their
# default, so fingerprints (and embedding caches keyed by them) of older configs stay valid.
_LATER_FIELDS_DEFAULTS = {"window_encoding": "joined"}
MAX_BUDGET_RETRIES = 16


class FeatureConfigError(UserError, ValueError):
    """A feature configuration field has a bad value (the message names field and value)."""


@dataclass(frozen=True)
class FeatureConfig:
    num_previous_prompts: int = 4
    token_budget: int = 512
    head_fraction: float = 0.5
    share_policy: Literal["even", "redistribute"] = "even"
    prompt_separator: str = "\n"
    elision: str = " "
    turn_count_encoding: Literal["log1p", "raw"] = "log1p"
    rules_version: int = FEATURE_RULES_VERSION
    window_encoding: Literal["joined", "prompt_mean"] = "joined"

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> FeatureConfigError:
            return FeatureConfigError(f"FeatureConfig.{field} {why}, got {getattr(self, field)!r}")

        for name in ("num_previous_prompts", "token_budget", "rules_version"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(name, "must be an integer")
        if self.num_previous_prompts < 0:
            raise bad("num_previous_prompts", "must be >= 0")
        if self.token_budget < 1:
            raise bad("token_budget", "must be >= 1")
        if (
            not isinstance(self.head_fraction, int | float)
            or isinstance(self.head_fraction, bool)
            or not 0.0 <= self.head_fraction <= 1.0
        ):
            raise bad("head_fraction", "must be a number in [0, 1]")
        if self.share_policy not in SHARE_POLICIES:
            raise bad("share_policy", f"must be one of {SHARE_POLICIES}")
        if self.turn_count_encoding not in TURN_COUNT_ENCODINGS:
            raise bad("turn_count_encoding", f"must be one of {TURN_COUNT_ENCODINGS}")
        if self.window_encoding not in WINDOW_ENCODINGS:
            raise bad("window_encoding", f"must be one of {WINDOW_ENCODINGS}")
        for name in ("prompt_separator", "elision"):
            if not isinstance(getattr(self, name), str):
                raise bad(name, "must be a string")
        if self.rules_version != FEATURE_RULES_VERSION:
            raise bad("rules_version", f"must be {FEATURE_RULES_VERSION} (this code's rules)")

    @property
    def window_size(self) -> int:
        """Prompts used per window: the current one and N previous ones."""
        return self.num_previous_prompts + 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise FeatureConfigError(f"FeatureConfig has no field(s) {', '.join(unknown)}")
        return cls(**dict(data))

    def fingerprint(self) -> str:
        """Stable across processes and versions of Python: sha256 of canonical JSON."""
        data = {
            k: v
            for k, v in self.to_dict().items()
            if k not in _LATER_FIELDS_DEFAULTS or v != _LATER_FIELDS_DEFAULTS[k]
        }
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ConversationWindow:
    """One prediction's input: a conversation's user prompts so far (oldest first, current
    last; older ones may be omitted) and how many user turns it has had, current included.

    `prompt_tokens` is the prompt of the request being predicted in the serving engine's
    tokens: the conversation so far plus the new user message, as the engine's tokenizer and
    chat template count it (vLLM's `Request.num_prompt_tokens`; in training, a sample's
    `request_tokens - output_tokens`). Only models trained with the `log_prompt_tokens`
    feature read it (its record in the feature registry, `predictor.access_features`, names the
    field); it travels with the window so that the RPC, the micro-batcher and
    `Predictor.predict` carry it per item without a parallel list."""

    conversation_id: str
    user_prompts: tuple[str, ...]
    turn_count: int
    prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.conversation_id, str):
            raise TypeError(
                f"conversation_id must be str, got {type(self.conversation_id).__name__}"
            )
        if isinstance(self.user_prompts, str) or not isinstance(self.user_prompts, Iterable):
            raise TypeError(
                f"user_prompts must be a sequence of str, got {type(self.user_prompts).__name__}"
            )
        prompts = tuple(self.user_prompts)
        object.__setattr__(self, "user_prompts", prompts)
        if not prompts:
            raise ValueError(f"conversation {self.conversation_id!r}: user_prompts is empty")
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise TypeError(
                    f"conversation {self.conversation_id!r}: user_prompts[{i}] "
                    f"must be str, got {type(prompt).__name__}"
                )
        if not isinstance(self.turn_count, int) or isinstance(self.turn_count, bool):
            raise TypeError(
                f"conversation {self.conversation_id!r}: turn_count must be int, "
                f"got {type(self.turn_count).__name__}"
            )
        if self.turn_count < len(prompts):
            raise ValueError(
                f"conversation {self.conversation_id!r}: turn_count {self.turn_count} is less "
                f"than the {len(prompts)} user prompts given"
            )
        tokens = self.prompt_tokens
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)):
            raise TypeError(
                f"conversation {self.conversation_id!r}: prompt_tokens must be int "
                f"or None, got {type(tokens).__name__}"
            )
        if tokens is not None and tokens < 0:
            raise ValueError(
                f"conversation {self.conversation_id!r}: prompt_tokens must be >= 0, got {tokens}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The RPC's item shape: {"conversation_id", "user_prompts", "turn_count"}, plus
        "prompt_tokens" when set (left out otherwise, so the item stays what older servers,
        which refuse unknown fields, accept)."""
        item: dict[str, Any] = {
            "conversation_id": self.conversation_id,
            "user_prompts": list(self.user_prompts),
            "turn_count": self.turn_count,
        }
        if self.prompt_tokens is not None:
            item["prompt_tokens"] = self.prompt_tokens
        return item

    @property
    def turn_index(self) -> int:
        """0-based index of the current turn."""
        return self.turn_count - 1

    @classmethod
    def from_prompts(cls, conversation_id: str, user_prompts: Sequence[str]) -> ConversationWindow:
        """A window holding every user prompt so far: the turn count is their number."""
        return cls(conversation_id, tuple(user_prompts), len(user_prompts))


def windows_for_conversation(
    conversation_id: str, user_prompts: Sequence[str], keep_last: int | None = None
) -> list[ConversationWindow]:
    """One window per user turn (training samples). `keep_last` stores only the last few
    prompts in each window (enough for the features) so long conversations stay O(turns)."""
    windows = []
    for turn in range(1, len(user_prompts) + 1):
        start = 0 if keep_last is None else max(0, turn - keep_last)
        windows.append(ConversationWindow(conversation_id, tuple(user_prompts[start:turn]), turn))
    return windows


def encode_turn_counts(
    turn_counts: Sequence[int] | np.ndarray, config: FeatureConfig
) -> np.ndarray:
    """The MLP's turn scalar for each count, float32 (see the module docstring)."""
    counts = np.asarray(turn_counts, dtype=np.float64)
    if counts.ndim != 1:
        raise ValueError(f"turn_counts must be one-dimensional, got shape {counts.shape}")
    if not np.all(np.isfinite(counts)) or np.any(counts < 1):
        raise ValueError("turn counts must be finite and >= 1")
    if config.turn_count_encoding == "log1p":
        return np.log1p(counts).astype(np.float32)
    return counts.astype(np.float32)


def split_evenly(content_budget: int, slots: int) -> int:
    return max(content_budget, 0) // slots


def water_fill(lengths: Sequence[int], content_budget: int) -> list[int]:
    """Shares for `redistribute`: equal caps, raised until the budget or the prompts run out."""
    shares = [0] * len(lengths)
    remaining = max(content_budget, 0)
    open_slots = [i for i, n in enumerate(lengths) if n > 0]
    while remaining > 0 and open_slots:
        cap = max(remaining // len(open_slots), 1)
        still_open = []
        for i in open_slots:
            grant = min(cap, lengths[i] - shares[i], remaining)
            shares[i] += grant
            remaining -= grant
            if shares[i] < lengths[i]:
                still_open.append(i)
            if remaining == 0:
                break
        open_slots = still_open
    return shares


def cut_head_tail(
    text: str, spans: Sequence[tuple[int, int]], share: int, head_fraction: float, elision: str
) -> str:
    """`text` if it fits in `share` tokens, else its first and last tokens joined by `elision`."""
    if len(spans) <= share:
        return text
    if share <= 0:
        return ""
    head = math.floor(share * head_fraction)
    tail = share - head
    head_text = text[: spans[head - 1][1]] if head > 0 else ""
    tail_text = text[spans[len(spans) - tail][0] :] if tail > 0 else ""
    if head_text and tail_text:
        return head_text + elision + tail_text
    return head_text or tail_text


class WindowTextBuilder:
    """Builds the embedder input text of each window under the token budget."""

    def __init__(
        self, config: FeatureConfig, tokenizer: EmbedderTokenizer, max_input_tokens: int
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.budget = min(config.token_budget, max_input_tokens)
        # Prefix and special tokens: what an empty text costs.
        self.overhead = tokenizer.count_input_tokens([""])[0]

    def build(self, windows: Sequence[ConversationWindow]) -> list[str]:
        recent = [w.user_prompts[-self.config.window_size :] for w in windows]
        distinct = list(dict.fromkeys(p for prompts in recent for p in prompts))
        spans = dict(zip(distinct, self.tokenizer.token_spans(distinct), strict=True))
        content_budget = [self.budget - self.overhead] * len(windows)
        texts = [self._compose(p, spans, b) for p, b in zip(recent, content_budget, strict=True)]
        for _ in range(MAX_BUDGET_RETRIES):
            counts = self.tokenizer.count_input_tokens(texts)
            over = [i for i, n in enumerate(counts) if n > self.budget]
            if not over:
                break
            for i in over:
                content_budget[i] -= counts[i] - self.budget
                texts[i] = self._compose(recent[i], spans, content_budget[i])
        return texts

    def prompt_texts(self, prompts: Sequence[str]) -> list[str]:
        """`prompt_mean` mode: each prompt alone, cut to one slot's share of the budget."""
        spans = self.tokenizer.token_spans(list(prompts))
        share = split_evenly(self.budget - self.overhead, self.config.window_size)
        texts = [
            cut_head_tail(p, s, share, self.config.head_fraction, self.config.elision)
            for p, s in zip(prompts, spans, strict=True)
        ]
        limit = share + self.overhead
        for _ in range(MAX_BUDGET_RETRIES):
            counts = self.tokenizer.count_input_tokens(texts)
            over = [i for i, n in enumerate(counts) if n > limit]
            if not over:
                break
            for i in over:
                texts[i] = cut_head_tail(
                    prompts[i],
                    spans[i],
                    share - (counts[i] - limit),
                    self.config.head_fraction,
                    self.config.elision,
                )
        return texts

    def _compose(
        self,
        prompts: Sequence[str],
        spans: Mapping[str, list[tuple[int, int]]],
        content_budget: int,
    ) -> str:
        config = self.config
        if config.share_policy == "even":
            shares = [split_evenly(content_budget, config.window_size)] * len(prompts)
        else:
            shares = water_fill([len(spans[p]) for p in prompts], content_budget)
        pieces = [
            cut_head_tail(p, spans[p], share, config.head_fraction, config.elision)
            for p, share in zip(prompts, shares, strict=True)
        ]
        return config.prompt_separator.join(pieces)
