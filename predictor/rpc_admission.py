"""The work a prediction request brings: the tokens the embedder will be fed for each window.

The batcher admits a request by the model time queued ahead of it, learnt in seconds per
token; each window is charged the tokens its embedder input will hold, computed here the way
`features.WindowTextBuilder` composes that input, without building it. Errors lean towards
charging more, never less.

Why tokens and how they are estimated: docs/design.md, "Micro-batching and admission".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from predictor.embedders.base import EmbedderTokenizer
from predictor.features import ConversationWindow, FeatureConfig, split_evenly

# Natural text runs 1 (CJK) to ~5 (English, code) characters per subword token; past this
# many characters per token of a prompt's share, the prompt is certain to fill its share.
MAX_CHARS_PER_TOKEN = 8


@dataclass(frozen=True)
class WindowTokenEstimator:
    """Tokens the embedder is fed per window, for one model (feature rules + tokenizer)."""

    tokenizer: EmbedderTokenizer
    window_size: int
    overhead_tokens: int  # prefix and special tokens: what an empty text costs
    prompt_cap_tokens: int  # the most one prompt can contribute
    window_cap_tokens: int  # the most a window's prompts can contribute together
    per_prompt_overhead: bool  # prompt_mean: every prompt is its own embedder input

    @classmethod
    def for_model(
        cls, config: FeatureConfig, tokenizer: EmbedderTokenizer, max_input_tokens: int
    ) -> WindowTokenEstimator:
        budget = min(config.token_budget, max_input_tokens)
        overhead = tokenizer.count_input_tokens([""])[0]
        content = max(budget - overhead, 0)
        share = split_evenly(content, config.window_size)
        if config.window_encoding == "prompt_mean":
            return cls(
                tokenizer, config.window_size, overhead, share, share * config.window_size, True
            )
        prompt_cap = share if config.share_policy == "even" else content
        return cls(tokenizer, config.window_size, overhead, prompt_cap, content, False)

    @classmethod
    def for_predictor(cls, predictor) -> WindowTokenEstimator:
        embedder = predictor.embedder
        return cls.for_model(
            predictor.feature_config, embedder.tokenizer, embedder.max_input_tokens
        )

    @property
    def max_chars_counted(self) -> int:
        return self.prompt_cap_tokens * MAX_CHARS_PER_TOKEN

    def chars_to_count(self, windows: Sequence[ConversationWindow]) -> int:
        """Characters `window_tokens` would tokenize (to decide whether to do it off the
        event loop)."""
        limit = self.max_chars_counted
        return sum(
            len(p) for w in windows for p in w.user_prompts[-self.window_size :] if len(p) <= limit
        )

    def window_tokens(self, windows: Sequence[ConversationWindow]) -> np.ndarray:
        """int64 tokens per window (>= the overhead: even an empty text costs that)."""
        recent = [w.user_prompts[-self.window_size :] for w in windows]
        limit = self.max_chars_counted
        counted = list(dict.fromkeys(p for prompts in recent for p in prompts if len(p) <= limit))
        try:
            totals = self.tokenizer.count_input_tokens(counted) if counted else []
            content = {
                p: max(n - self.overhead_tokens, 0) for p, n in zip(counted, totals, strict=True)
            }
        except Exception:  # a tokenizer busy in another thread: charge the most instead
            content = {}
        out = np.empty(len(windows), dtype=np.int64)
        cap = self.prompt_cap_tokens
        for i, prompts in enumerate(recent):
            shares = [min(content.get(p, cap), cap) for p in prompts]
            if self.per_prompt_overhead:
                out[i] = sum(shares) + self.overhead_tokens * len(prompts)
            else:
                out[i] = min(sum(shares), self.window_cap_tokens) + self.overhead_tokens
        return out
