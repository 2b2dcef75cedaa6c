"""The prediction RPC's JSON shapes and the limits that bound one request.

Request (`POST /v1/predict`):

    {"items": [{"conversation_id": "c1", "user_prompts": ["older", "current"],
                "turn_count": 7, "prompt_tokens": 1532}, ...]}

Response: `{"probabilities": [0.83, ...]}`, one probability per item, in order.

`prompt_tokens` (optional, an int >= 0) is the request's prompt size in the serving engine's
tokens (`ConversationWindow.prompt_tokens`, vLLM's `num_prompt_tokens`: the prompt alone, not
the prompt + output that training's `request_tokens` counts); a model trained with
`log_prompt_tokens` needs it (the server answers 422 for an item without it), any other model
ignores it.

Validation is strict (no "7" for 7, no 7.0, no true) so a caller's bug surfaces as a 422 that
says which field of which item is wrong, instead of a silently coerced prediction. Every size
is bounded: items per request, prompts per item, characters per prompt, id length, and the
body itself and its JSON nesting depth (both checked before parsing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from predictor.errors import InvalidInputError
from predictor.features import ConversationWindow
from predictor.request_features import PROMPT_TOKENS_FEATURE


@dataclass(frozen=True)
class RequestLimits:
    max_items_per_request: int = 64
    max_prompts_per_item: int = 64
    max_prompt_chars: int = 65_536
    max_conversation_id_chars: int = 256
    max_turn_count: int = 1_000_000
    # Far beyond any context window; bounds what a feature formula is ever asked to take.
    max_prompt_tokens: int = 100_000_000
    # Checked before parsing, so a huge body is refused (413) without being held in memory.
    max_body_bytes: int = 16 * 1024 * 1024
    # Checked on the raw bytes before parsing: a request nests 4 levels deep; JSON nested
    # thousands deep would exhaust the parser's recursion (server_body.py).
    max_json_depth: int = 32

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(
                    f"RequestLimits.{name} must be a positive integer, got {value!r}"
                )


def request_model(limits: RequestLimits) -> type[BaseModel]:
    """The pydantic model of a predict request under `limits`."""
    prompt = Annotated[str, StringConstraints(max_length=limits.max_prompt_chars)]

    class PredictItem(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        conversation_id: str = Field(max_length=limits.max_conversation_id_chars)
        user_prompts: list[prompt] = Field(min_length=1, max_length=limits.max_prompts_per_item)
        turn_count: int = Field(ge=1, le=limits.max_turn_count)
        prompt_tokens: int | None = Field(default=None, ge=0, le=limits.max_prompt_tokens)

        @model_validator(mode="after")
        def turn_count_covers_prompts(self) -> PredictItem:
            if self.turn_count < len(self.user_prompts):
                raise ValueError(
                    f"turn_count {self.turn_count} is less than the "
                    f"{len(self.user_prompts)} user_prompts given"
                )
            return self

        def window(self) -> ConversationWindow:
            return ConversationWindow(
                self.conversation_id, tuple(self.user_prompts), self.turn_count, self.prompt_tokens
            )

    class PredictRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        items: list[PredictItem] = Field(min_length=1, max_length=limits.max_items_per_request)

        def windows(self) -> list[ConversationWindow]:
            return [item.window() for item in self.items]

    return PredictRequest


class ReloadRequest(BaseModel):
    """`POST /v1/reload`: load `artifact` (default: the artifact the server started with)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    artifact: str | None = None


def window_to_json(window: ConversationWindow) -> dict[str, Any]:
    return window.to_dict()


def validation_details(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pydantic errors trimmed to what a caller needs: where, what, and the offending type."""
    details = []
    for error in errors:
        entry = {
            "loc": list(error.get("loc", ())),
            "msg": error.get("msg", ""),
            "type": error.get("type", ""),
        }
        value = error.get("input")
        if isinstance(value, float) and not math.isfinite(value):
            entry["input"] = repr(value)  # NaN and infinities are not JSON
        elif isinstance(value, bool | int | float) or value is None:
            entry["input"] = value
        else:
            entry["input_type"] = type(value).__name__
        details.append(entry)
    return details


def missing_prompt_tokens_details(indices: list[int]) -> list[dict[str, Any]]:
    """422 details, in `validation_details`' shape, for items the model in service cannot
    predict because they lack `prompt_tokens` (valid JSON, but not enough for this model)."""
    return [
        {
            "loc": ["items", i, "prompt_tokens"],
            "msg": "this model needs prompt_tokens (the request's prompt tokens, counted by "
            f"the serving engine) for its {PROMPT_TOKENS_FEATURE} feature",
            "type": "missing",
        }
        for i in indices
    ]
