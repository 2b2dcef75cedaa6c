"""The work a prediction request brings: the tokens the embedder will be fed for each window.

The server admits a request only when the model time queued ahead of it, plus its own, fits
in a bound (batching.py). Counting that work in windows misjudges it badly: a first-turn
window of a few words is ~10 tokens, a window of five long prompts is the whole 512-token
budget, and a transformer's time grows with the tokens it is fed. So the batcher learns
seconds per token, and each window is charged the tokens its embedder input will hold,
computed here the way `features.WindowTextBuilder` composes that input, without building it:

- joined windows (the paper's encoding): the prefix and special tokens, plus each of the last
  N+1 prompts cut to its share of the content budget (`share_policy="even"`: an equal share
  per slot; `"redistribute"`: the content budget as a whole);
- `prompt_mean` windows: each prompt is embedded alone, so each pays the overhead and its
  share (cached prompts cost nothing at all: the estimate is an upper bound there).

Only prompts short enough to matter are tokenized: a prompt longer than its share times
`MAX_CHARS_PER_TOKEN` characters is charged its full share unread (an upper bound on what it
can cost), so one request costs at most its items × N+1 × that many characters of tokenizing,
a small fraction of embedding them. Errors lean towards charging more, never less.
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
