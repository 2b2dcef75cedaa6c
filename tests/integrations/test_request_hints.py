"""Reading LPC's fields from a request: valid ones are used, malformed ones reported."""

from __future__ import annotations

import math

import pytest

from lpc.integrations.request_hints import NO_HINTS, RequestHints, parse_hints


def test_no_fields_means_no_hints() -> None:
    assert parse_hints(None) is NO_HINTS
    assert parse_hints({}) is NO_HINTS
    assert parse_hints({"kv_transfer_params": {"x": 1}}) is NO_HINTS


def test_probability_and_conversation() -> None:
    hints = parse_hints({"lpc_probability": 0.83, "lpc_conversation_id": "c-1"})
    assert hints == RequestHints(0.83, "c-1")
    assert parse_hints({"lpc_probability": 1}).probability == 1.0


def test_prediction_item_matches_the_rpc_schema() -> None:
    hints = parse_hints(
        {"lpc_conversation_id": "c", "lpc_user_prompts": ["a", "b"], "lpc_turn_count": 7}
    )
    assert hints.can_predict
    assert hints.prediction_item() == {
        "conversation_id": "c",
        "user_prompts": ["a", "b"],
        "turn_count": 7,
    }
    # turn_count defaults to the prompts given, and never counts fewer turns than prompts.
    assert (
        parse_hints({"lpc_conversation_id": "c", "lpc_user_prompts": ["a", "b"]}).prediction_item()[
            "turn_count"
        ]
        == 2
    )
    assert (
        parse_hints(
            {"lpc_conversation_id": "c", "lpc_user_prompts": ["a", "b"], "lpc_turn_count": 1}
        ).prediction_item()["turn_count"]
        == 2
    )
    # The engine's prompt token count, when the plugin has it, rides along for the model.
    assert hints.prediction_item(prompt_tokens=96) == {
        "conversation_id": "c",
        "user_prompts": ["a", "b"],
        "turn_count": 7,
        "prompt_tokens": 96,
    }
    assert not parse_hints({"lpc_conversation_id": "c"}).can_predict
    with pytest.raises(ValueError):
        parse_hints({"lpc_conversation_id": "c"}).prediction_item()


@pytest.mark.parametrize(
    ("extra_args", "fragment"),
    [
        ({"lpc_probability": 1.5}, "lpc_probability must be a number in [0, 1]"),
        ({"lpc_probability": math.nan}, "lpc_probability"),
        ({"lpc_probability": True}, "lpc_probability"),
        ({"lpc_probability": "0.5"}, "lpc_probability"),
        ({"lpc_conversation_id": ""}, "lpc_conversation_id"),
        ({"lpc_conversation_id": 17}, "lpc_conversation_id"),
        ({"lpc_conversation_id": "x" * 300}, "at most 256"),
        ({"lpc_user_prompts": "hello"}, "lpc_user_prompts must be a list of strings"),
        ({"lpc_user_prompts": ["a", 3]}, "lpc_user_prompts"),
        ({"lpc_turn_count": 0}, "lpc_turn_count must be an integer >= 1"),
    ],
)
def test_malformed_fields_are_dropped_and_reported(extra_args: dict, fragment: str) -> None:
    hints = parse_hints(
        {**extra_args, "lpc_conversation_id": extra_args.get("lpc_conversation_id", "ok")}
    )
    assert hints.problems and fragment in hints.problems[0]
    for key in extra_args:
        field = key.removeprefix("lpc_")
        value = getattr(hints, field)
        assert value in (None, ()), f"{key} was kept although malformed"


def test_one_bad_field_does_not_drop_the_others() -> None:
    hints = parse_hints({"lpc_probability": 7, "lpc_conversation_id": "c-9"})
    assert hints.probability is None and hints.conversation_id == "c-9"
    assert len(hints.problems) == 1
