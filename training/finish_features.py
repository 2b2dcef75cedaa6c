"""Opt-in scalar features known when a request finishes (beyond the paper).

The evictor consumes a prediction only when the request finishes and releases its blocks, so
by then the serving engine also knows the assistant's reply and the size of the conversation.
The paper found reply *embeddings* unhelpful with a small embedder; these are cheap scalars
instead. Each is a named function of a `TurnSample`; a model records the names it was trained
with (`MLPConfig.extra_features`), and whoever serves it computes the same names the same way
(`finish_feature_matrix`). Sizes are in characters of message text, which any caller has, or
in the serving engine's own tokens (`TOKEN_FEATURES`: the request's prompt + output tokens,
which the engine counts anyway); token features need samples with token counts attached
(`training.samples.with_token_counts`), and the artifact records the tokenizer.

Column order of the MLP input: embedding, finish features (in the recorded order), turn count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from predictor.errors import InvalidInputError
from predictor.request_features import log_prompt_chars, log_prompt_tokens
from training.samples import TurnSample


def _count(value: int | None, name: str) -> int:
    if value is None:
        raise ValueError(
            f"finish feature {name} needs token counts on the samples "
            "(training.samples.with_token_counts)"
        )
    return value


def _tokens(value: int | None, name: str) -> float:
    return math.log1p(_count(value, name))


def _prompt_tokens(sample: TurnSample) -> int | None:
    if sample.request_tokens is None or sample.output_tokens is None:
        return None
    return sample.request_tokens - sample.output_tokens


def _ends_with_question(text: str) -> float:
    stripped = text.rstrip()
    return float(stripped.endswith("?") or stripped.endswith("？"))


FINISH_FEATURES: dict[str, Callable[[TurnSample], float]] = {
    # characters of every message up to and including the reply: the conversation's size
    "log_context_chars": lambda s: math.log1p(s.context_chars),
    # the reply's length
    "log_reply_chars": lambda s: math.log1p(len(s.reply)),
    # the reply ends with a question to the user
    "reply_asks": lambda s: _ends_with_question(s.reply),
    # the current user prompt's length (formula shared with serving: predictor.request_features)
    "log_prompt_chars": lambda s: log_prompt_chars(s.window[-1]),
    # the finishing request's size in serving tokens: the whole conversation so far
    "log_request_tokens": lambda s: _tokens(s.request_tokens, "log_request_tokens"),
    # the reply's length in serving tokens
    "log_output_tokens": lambda s: _tokens(s.output_tokens, "log_output_tokens"),
    # the request's prompt in serving tokens (history + the new user message): unlike the two
    # above, known when the engine first schedules the request (vLLM's num_prompt_tokens), so
    # a prediction request carries it (formula shared with serving: predictor.request_features)
    "log_prompt_tokens": lambda s: log_prompt_tokens(
        _count(_prompt_tokens(s), "log_prompt_tokens")
    ),
}
TOKEN_FEATURES = frozenset({"log_request_tokens", "log_output_tokens", "log_prompt_tokens"})


def needs_token_counts(names: Sequence[str]) -> bool:
    return any(name in TOKEN_FEATURES for name in names)


def check_finish_features(names: Sequence[str]) -> tuple[str, ...]:
    """The names as a tuple, or ValueError naming the unknown or repeated one."""
    names = tuple(names)
    for name in names:
        if name not in FINISH_FEATURES:
            raise InvalidInputError(
                f"unknown finish feature {name!r}; known: {', '.join(FINISH_FEATURES)}"
            )
    if len(set(names)) != len(names):
        raise InvalidInputError(f"finish features listed twice: {names}")
    return names


def finish_feature_matrix(samples: Sequence[TurnSample], names: Sequence[str]) -> np.ndarray:
    """float32 (len(samples), len(names))."""
    functions = [FINISH_FEATURES[n] for n in check_finish_features(names)]
    out = np.empty((len(samples), len(functions)), dtype=np.float32)
    for i, sample in enumerate(samples):
        for j, function in enumerate(functions):
            out[i, j] = function(sample)
    return out
