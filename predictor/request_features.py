"""Finish features a prediction request carries itself, defined once for training and serving.

A model may be trained with scalar finish features besides the window (`MLPConfig
.extra_features`; `training.finish_features` names them all and computes them over training
samples). Most of them exist only once the request has finished, after the serving engine
asked for its prediction: the reply, its length in tokens (`log_output_tokens`), the request's
prompt + output tokens (`log_request_tokens`), the characters of the whole exchange. Two are
known when the engine first schedules the request, so a prediction request can carry them:

- `log_prompt_tokens`: log(1 + the request's prompt tokens), i.e. the whole conversation so
  far plus the new user message as the serving engine tokenizes it (vLLM:
  `Request.num_prompt_tokens`). It is sent as the window's `prompt_tokens`, and must be counted
  with the tokenizer and chat template the model was trained with (the artifact records them
  in `notes["serving_tokenizer"]`).
- `log_prompt_chars`: log(1 + the length of the current user prompt in characters), read from
  the window's last prompt.

The per-feature formulas live here and `training.finish_features` calls them, so training and
serving cannot drift apart. Like the rest of `predictor`, this module depends on no other
package of the repository, and it is light to import (numpy and `predictor.features`, no torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from predictor.errors import UserError
from predictor.features import ConversationWindow

PROMPT_TOKENS_FEATURE = "log_prompt_tokens"


def log_prompt_tokens(prompt_tokens: int) -> float:
    """The `log_prompt_tokens` feature of a request with this many prompt tokens."""
    return math.log1p(prompt_tokens)


def log_prompt_chars(current_prompt: str) -> float:
    """The `log_prompt_chars` feature of the turn whose user prompt this is."""
    return math.log1p(len(current_prompt))


class UnservableFeaturesError(UserError, ValueError):
    """A model needs finish features that a prediction request cannot carry."""


class MissingPromptTokensError(ValueError):
    """A window lacks the `prompt_tokens` its model needs."""


def _window_prompt_tokens(window: ConversationWindow) -> float:
    if window.prompt_tokens is None:
        raise MissingPromptTokensError(
            f"conversation {window.conversation_id!r}: the window has no prompt_tokens, and "
            f"the model's {PROMPT_TOKENS_FEATURE} feature needs them"
        )
    return log_prompt_tokens(window.prompt_tokens)


# name -> the feature of one window; the names are training.finish_features' names.
REQUEST_FEATURES: dict[str, Callable[[ConversationWindow], float]] = {
    PROMPT_TOKENS_FEATURE: _window_prompt_tokens,
    "log_prompt_chars": lambda window: log_prompt_chars(window.user_prompts[-1]),
}


def unservable_features(names: Sequence[str]) -> tuple[str, ...]:
    """The names among `names` that a prediction request cannot supply."""
    return tuple(name for name in names if name not in REQUEST_FEATURES)


def check_servable(names: Sequence[str], what: str) -> None:
    """Raise `UnservableFeaturesError` (starting with `what`, e.g. "artifact X") when a model
    with these finish features cannot be served from prediction requests."""
    missing = unservable_features(names)
    if missing:
        raise UnservableFeaturesError(
            f"{what} needs finish-time features {list(missing)} that a prediction request "
            f"cannot carry (they are known only once the request has finished); a served model "
            f"may use only {sorted(REQUEST_FEATURES)}"
        )


def needs_prompt_tokens(names: Sequence[str]) -> bool:
    return PROMPT_TOKENS_FEATURE in names


def windows_without_prompt_tokens(windows: Sequence[ConversationWindow]) -> list[int]:
    """Indices of the windows whose `prompt_tokens` is unset."""
    return [i for i, window in enumerate(windows) if window.prompt_tokens is None]


def request_feature_matrix(
    windows: Sequence[ConversationWindow], names: Sequence[str]
) -> np.ndarray:
    """float32 (len(windows), len(names)), filled like `training.finish_features
    .finish_feature_matrix` fills it for the same turns. Raises `UnservableFeaturesError` or
    `MissingPromptTokensError` (naming the windows) when the windows cannot supply them."""
    check_servable(names, "the model")
    if needs_prompt_tokens(names):
        missing = windows_without_prompt_tokens(windows)
        if missing:
            shown = ", ".join(f"{i} ({windows[i].conversation_id!r})" for i in missing[:5])
            raise MissingPromptTokensError(
                f"{len(missing)} window(s) have no prompt_tokens, which this model needs for "
                f"its {PROMPT_TOKENS_FEATURE} feature: {shown}"
                + (", ..." if len(missing) > 5 else "")
            )
    functions = [REQUEST_FEATURES[name] for name in names]
    out = np.empty((len(windows), len(functions)), dtype=np.float32)
    for i, window in enumerate(windows):
        for j, function in enumerate(functions):
            out[i, j] = function(window)
    return out
