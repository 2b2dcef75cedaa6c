"""The formulas of the text model's scalar inputs, over a training sample or an RPC window.

The records that name these inputs, say when each is known and pair each formula with the
feature's other computations live in the one feature registry (`predictor.access_features`);
this module only holds the formulas they call, and the shape of the training record they read
(`TextSample`: `training.samples.TurnSample` has it), so that `predictor` never imports
`training`. Sizes are in characters of message text, which any caller has, or in the serving
engine's own tokens (a sample's `request_tokens` = prompt + output and `output_tokens`, which
a caller attaches: `training.samples.with_token_counts`; a window's `prompt_tokens`).
"""

from __future__ import annotations

import math
from typing import Protocol

from predictor.features import ConversationWindow


class TextSample(Protocol):
    """One user turn as training (and the conversation replay) sees it."""

    @property
    def window(self) -> tuple[str, ...]: ...  # the last user prompts, current last

    @property
    def reply(self) -> str: ...  # the assistant's answer to this turn ("" if none)

    @property
    def context_chars(self) -> int: ...  # characters of every message up to the reply

    @property
    def request_tokens(self) -> int | None: ...  # prompt + output, serving tokens

    @property
    def output_tokens(self) -> int | None: ...


class MissingTokenCountsError(ValueError):
    """A sample lacks the serving token counts a feature reads."""


class MissingPromptTokensError(ValueError):
    """A window lacks the `prompt_tokens` its model needs."""


def log_prompt_tokens(prompt_tokens: int) -> float:
    """log(1 + the request's prompt tokens), the same number on every path."""
    return math.log1p(prompt_tokens)


def log_prompt_chars(current_prompt: str) -> float:
    """log(1 + the length of the current user prompt in characters)."""
    return math.log1p(len(current_prompt))


def ends_with_question(text: str) -> float:
    stripped = text.rstrip()
    return float(stripped.endswith("?") or stripped.endswith("？"))


def sample_count(value: int | None, name: str) -> int:
    if value is None:
        raise MissingTokenCountsError(
            f"feature {name} needs token counts on the samples (training.samples.with_token_counts)"
        )
    return value


def sample_prompt_tokens(sample: TextSample) -> int:
    """The request's prompt in serving tokens: prompt + output minus output."""
    request = sample_count(sample.request_tokens, "log_prompt_tokens")
    return request - sample_count(sample.output_tokens, "log_prompt_tokens")


def window_prompt_tokens(window: ConversationWindow) -> int:
    if window.prompt_tokens is None:
        raise MissingPromptTokensError(
            f"conversation {window.conversation_id!r}: the window has no prompt_tokens, and "
            "the model's log_prompt_tokens feature needs them"
        )
    return window.prompt_tokens
