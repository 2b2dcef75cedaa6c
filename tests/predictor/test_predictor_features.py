"""Window text and turn-count features: the paper's rules and the edge cases we decided."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from predictor.features import (
    ConversationWindow,
    FeatureConfig,
    FeatureConfigError,
    WindowTextBuilder,
    cut_head_tail,
    encode_turn_counts,
    water_fill,
    windows_for_conversation,
)
from tests.predictor.fakes import WhitespaceTokenizer

TOKENIZER = WhitespaceTokenizer()  # overhead: 2 specials + 1 prefix token = 3


def words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def build(config: FeatureConfig, *windows: ConversationWindow, max_tokens: int = 512) -> list[str]:
    return WindowTextBuilder(config, TOKENIZER, max_tokens).build(list(windows))


def test_window_keeps_last_n_plus_one_prompts_oldest_first():
    prompts = [f"p{i}" for i in range(7)]
    (text,) = build(FeatureConfig(), ConversationWindow.from_prompts("c", prompts))
    assert text == "\n".join(["p2", "p3", "p4", "p5", "p6"])


def test_budget_is_split_evenly_over_n_plus_one_slots_even_on_a_first_turn():
    # 512 − 3 overhead = 509 content tokens, 5 slots → 101 tokens each.
    (text,) = build(FeatureConfig(), ConversationWindow.from_prompts("c", [words("w", 1000)]))
    kept = text.split()
    assert len(kept) == 101
    assert kept[:50] == [f"w{i}" for i in range(50)]
    assert kept[50:] == [f"w{i}" for i in range(1000 - 51, 1000)]


def test_long_prompts_keep_head_and_tail_and_fit_the_budget():
    prompts = [words(f"t{k}x", 300) for k in range(5)]
    (text,) = build(FeatureConfig(), ConversationWindow.from_prompts("c", prompts))
    assert TOKENIZER.count_input_tokens([text])[0] <= 512
    parts = text.split("\n")
    assert len(parts) == 5
    for k, part in enumerate(parts):
        tokens = part.split()
        assert len(tokens) == 101
        assert tokens[0] == f"t{k}x0" and tokens[-1] == f"t{k}x299"


def test_short_prompts_are_kept_whole():
    prompts = ["hello there", "", "what is a KV cache?"]
    (text,) = build(FeatureConfig(), ConversationWindow("c", tuple(prompts), 9))
    assert text == "hello there\n\nwhat is a KV cache?"


def test_head_fraction_moves_the_cut():
    config = FeatureConfig(head_fraction=1.0)
    (text,) = build(config, ConversationWindow.from_prompts("c", [words("w", 500)]))
    assert text.split() == [f"w{i}" for i in range(101)]
    config = FeatureConfig(head_fraction=0.0)
    (text,) = build(config, ConversationWindow.from_prompts("c", [words("w", 500)]))
    assert text.split() == [f"w{i}" for i in range(399, 500)]


def test_redistribute_gives_unused_tokens_to_long_prompts():
    config = FeatureConfig(share_policy="redistribute")
    (text,) = build(config, ConversationWindow.from_prompts("c", ["short one", words("w", 1000)]))
    assert TOKENIZER.count_input_tokens([text])[0] == 512
    assert text.startswith("short one\n")


def test_budget_is_capped_by_the_embedder_input_limit():
    (text,) = build(
        FeatureConfig(), ConversationWindow.from_prompts("c", [words("w", 1000)]), max_tokens=128
    )
    # (128 − 3) // 5 = 25 tokens.
    assert len(text.split()) == 25


def test_tiny_budget_gives_empty_prompts_not_errors():
    config = FeatureConfig(token_budget=5)
    (text,) = build(config, ConversationWindow.from_prompts("c", [words("w", 10), "x y"]))
    assert TOKENIZER.count_input_tokens([text])[0] <= 5


class DriftingTokenizer(WhitespaceTokenizer):
    """Counts one extra token per joined prompt, like a tokenizer whose cuts re-tokenise
    differently: the builder must still hold the final text to the budget."""

    def count_input_tokens(self, texts):
        return [
            n + t.count("\n") * 3
            for n, t in zip(super().count_input_tokens(texts), texts, strict=True)
        ]


def test_final_count_is_enforced_when_rejoined_text_grows():
    tokenizer = DriftingTokenizer()
    builder = WindowTextBuilder(FeatureConfig(), tokenizer, 512)
    prompts = [words(f"t{k}x", 300) for k in range(5)]
    (text,) = builder.build([ConversationWindow.from_prompts("c", prompts)])
    assert tokenizer.count_input_tokens([text])[0] <= 512


def test_cut_head_tail_uses_original_text_between_token_spans():
    text = "alpha  beta\tgamma delta"
    spans = TOKENIZER.token_spans([text])[0]
    assert cut_head_tail(text, spans, 2, 0.5, " … ") == "alpha … delta"
    assert cut_head_tail(text, spans, 3, 0.5, " ") == "alpha gamma delta"
    assert cut_head_tail(text, spans, 4, 0.5, " ") == text
    assert cut_head_tail(text, spans, 0, 0.5, " ") == ""


def test_water_fill_respects_budget_and_lengths():
    assert water_fill([10, 1000, 0], 100) == [10, 90, 0]
    assert water_fill([10, 20], 1000) == [10, 20]
    assert sum(water_fill([7, 7, 7], 10)) == 10


def test_feature_config_round_trip_and_fingerprint():
    config = FeatureConfig(num_previous_prompts=2, head_fraction=0.25)
    again = FeatureConfig.from_dict(config.to_dict())
    assert again == config
    assert again.fingerprint() == config.fingerprint()
    assert FeatureConfig().fingerprint() != config.fingerprint()
    # Pinned: a change here means cached embeddings keyed by it silently go stale.
    assert FeatureConfig().fingerprint() == "316ac0b9cb3cdfe7"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_previous_prompts": -1}, "num_previous_prompts"),
        ({"token_budget": 0}, "token_budget"),
        ({"head_fraction": 1.5}, "head_fraction"),
        ({"head_fraction": float("nan")}, "head_fraction"),
        ({"share_policy": "fair"}, "share_policy"),
        ({"turn_count_encoding": "sqrt"}, "turn_count_encoding"),
        ({"token_budget": 512.0}, "token_budget"),
    ],
)
def test_feature_config_validation_names_field_and_value(changes, field):
    with pytest.raises(FeatureConfigError, match=rf"FeatureConfig\.{field} .*got"):
        dataclasses.replace(FeatureConfig(), **changes)


def test_feature_config_from_dict_rejects_unknown_fields():
    with pytest.raises(FeatureConfigError, match="bogus"):
        FeatureConfig.from_dict({"bogus": 1})


def test_conversation_window_validation():
    window = ConversationWindow("c", ["a", "b"], 5)
    assert window.user_prompts == ("a", "b") and window.turn_index == 4
    with pytest.raises(ValueError, match="empty"):
        ConversationWindow("c", (), 1)
    with pytest.raises(ValueError, match="less than"):
        ConversationWindow("c", ("a", "b"), 1)
    with pytest.raises(TypeError, match="turn_count"):
        ConversationWindow("c", ("a",), True)
    with pytest.raises(TypeError, match="user_prompts"):
        ConversationWindow("c", "abc", 1)
    with pytest.raises(TypeError, match=r"user_prompts\[1\]"):
        ConversationWindow("c", ("a", 3), 2)


def test_windows_for_conversation_one_per_turn():
    windows = windows_for_conversation("c", ["a", "b", "c", "d"], keep_last=2)
    assert [w.turn_count for w in windows] == [1, 2, 3, 4]
    assert windows[3].user_prompts == ("c", "d")
    assert windows[0].user_prompts == ("a",)


def test_encode_turn_counts():
    config = FeatureConfig()
    np.testing.assert_allclose(
        encode_turn_counts([1, 2, 100], config), np.log1p([1, 2, 100]).astype(np.float32)
    )
    raw = FeatureConfig(turn_count_encoding="raw")
    assert encode_turn_counts([3], raw).tolist() == [3.0]
    with pytest.raises(ValueError):
        encode_turn_counts([0], config)
