"""The prediction RPC's JSON shapes and the limits that bound one request.

`POST /v1/predict` takes `{"items": [...]}` and answers `{"probabilities": [...]}`, one per
item, in order: a text model's items carry `user_prompts`, `turn_count` and optionally
`prompt_tokens`; an access-only model's carry `access_features` by name. Validation is strict
and every size is bounded, so a caller's bug surfaces as a 422 naming the field and item.

The shapes and the rules: docs/design.md, "The prediction RPC's shapes"; docs/predictor.md,
"`POST /v1/predict`".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

from predictor.access_features import computable_on, feature, window_fields, windows_lacking
from predictor.errors import InvalidInputError
from predictor.features import ConversationWindow


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


ACCESS_ITEM_FIELD = "access_features"
# An access model computes in float32: a value beyond this is as infinite to it as Infinity.
FLOAT32_MAX = float(np.finfo(np.float32).max)
TEXT_ITEM_FIELDS = frozenset({"user_prompts", "turn_count", "prompt_tokens"})


def access_feature_names() -> tuple[str, ...]:
    """Every name an access item may carry: the registered features an engine computes from
    its request state."""
    return computable_on("state")


def within_float32(value: float) -> float:
    """`value`, or a validation error (`out_of_range`) when float32 cannot hold it."""
    if abs(value) > FLOAT32_MAX:
        raise PydanticCustomError(
            "out_of_range",
            "Input should be at most {limit} in absolute value: the model computes in float32",
            {"limit": f"{FLOAT32_MAX:.8g}"},
        )
    return value


def access_request_model(limits: RequestLimits) -> type[BaseModel]:
    """The pydantic model of a predict request for an access-only model under `limits`
    (which feature names an item must hold depends on the model: `access_item_details`)."""
    value = Annotated[float, Field(allow_inf_nan=False), AfterValidator(within_float32)]

    class AccessItem(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        conversation_id: str | None = Field(
            default=None, max_length=limits.max_conversation_id_chars
        )
        access_features: dict[str, value] = Field(max_length=len(access_feature_names()))

    class AccessPredictRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)

        items: list[AccessItem] = Field(min_length=1, max_length=limits.max_items_per_request)

        def feature_rows(self, names: tuple[str, ...]) -> list[list[float]]:
            return [[item.access_features[n] for n in names] for item in self.items]

    return AccessPredictRequest


def access_item_details(
    items: list[dict[str, float]], names: tuple[str, ...]
) -> list[dict[str, Any]]:
    """422 details for items whose feature names differ from the model's (`names`): each
    unknown name and each missing one, at `items.i.access_features.name`."""
    details = []
    for i, given in enumerate(items):
        loc = ["items", i, ACCESS_ITEM_FIELD]
        for name in given:
            if name not in names:
                details.append(
                    {
                        "loc": [*loc, name],
                        "msg": f"this model does not read {name!r}; it reads {list(names)}",
                        "type": "extra_forbidden",
                    }
                )
        for name in names:
            if name not in given:
                details.append(
                    {
                        "loc": [*loc, name],
                        "msg": f"this model reads {name!r} (it reads {list(names)})",
                        "type": "missing",
                    }
                )
    return details


def out_of_range_details(
    rows: np.ndarray, standardised: np.ndarray, names: Sequence[str], indices: Sequence[int]
) -> list[dict[str, Any]]:
    """422 details for items (`indices`, with their raw `rows` and the model's `standardised`
    inputs for them) the model's float32 arithmetic overflows on, at
    `items.i.access_features.name`: each feature whose standardised value is beyond float32,
    or, where a layer overflowed instead, the feature furthest from its training mean (in
    standard deviations), which is where the item leaves the model's range."""
    details = []
    for i, row, z in zip(indices, rows, standardised, strict=True):
        loc = ["items", int(i), ACCESS_ITEM_FIELD]
        beyond = [j for j in range(len(names)) if not math.isfinite(z[j])]
        for j in beyond:
            details.append(
                {
                    "loc": [*loc, names[j]],
                    "msg": f"{names[j]} = {float(row[j])!r} is out of the model's range: its "
                    "standardised value ((value - mean) / std) overflows float32, the "
                    "arithmetic the model computes in",
                    "type": "out_of_range",
                    "input": float(row[j]),
                }
            )
        if not beyond:
            j = int(np.argmax(np.abs(z)))
            details.append(
                {
                    "loc": [*loc, names[j]],
                    "msg": f"{names[j]} = {float(row[j])!r} is out of the model's range: "
                    f"{float(z[j]):.3g} standard deviations from its training mean (the "
                    "furthest of this item's features), the model's float32 arithmetic "
                    "overflows on this item",
                    "type": "out_of_range",
                    "input": float(row[j]),
                }
            )
    return details


def wrong_kind_details(payload: object, access_model: bool) -> list[dict[str, Any]]:
    """422 details for items of the other kind than the model in service: an item holding
    `access_features` sent to a text model, or one without it sent to an access model."""
    items = payload.get("items") if isinstance(payload, dict) else None
    if not isinstance(items, list):
        return []
    if access_model:
        msg = (
            "the model in service is access-only: an item carries access_features (the "
            "values of the features it reads), not user_prompts and turn_count"
        )
    else:
        msg = (
            "the model in service reads text windows: an item carries user_prompts and "
            "turn_count, not access_features (those are for an access-only model)"
        )
    return [
        {"loc": ["items", i], "msg": msg, "type": "wrong_model_kind"}
        for i, item in enumerate(items)
        if isinstance(item, dict)
        and (
            ACCESS_ITEM_FIELD not in item and not TEXT_ITEM_FIELDS.isdisjoint(item)
            if access_model
            else ACCESS_ITEM_FIELD in item
        )
    ]


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


def missing_field_details(
    windows: list[ConversationWindow], names: tuple[str, ...], among: list[int] | None = None
) -> list[dict[str, Any]]:
    """422 details, in `validation_details`' shape, for items (all, or the indices `among`)
    lacking an optional field the features `names` of the model in service read (valid JSON,
    but not enough for this model): the registry says which feature reads which field."""
    details = []
    for field_name, readers in window_fields(names).items():
        described = "; ".join(f"{n}: {feature(n).description}" for n in readers)
        for i in windows_lacking(windows, field_name):
            if among is None or i in among:
                details.append(
                    {
                        "loc": ["items", i, field_name],
                        "msg": f"this model needs {field_name} (counted by the serving engine) "
                        f"for its {', '.join(readers)} feature ({described})",
                        "type": "missing",
                    }
                )
    return sorted(details, key=lambda d: d["loc"][1])
