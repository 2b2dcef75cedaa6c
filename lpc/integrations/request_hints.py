"""What a request tells the eviction plugin: its probability, or what to predict it from.

Requests carry LPC's fields in vLLM's `SamplingParams.extra_args`: `lpc_probability` (a
prediction made upstream), or `lpc_conversation_id`, `lpc_user_prompts` and `lpc_turn_count`
(predict it asynchronously); `lpc_signature` is a router's HMAC over the probability (`trust`).
What is parsed here is not yet trusted: `trust.HintTrust` decides what a release may use.
Malformed fields are dropped and counted (`PluginStats.invalid_hints`), never failing a
request. The fields: docs/serving.md, "How requests carry probabilities".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROBABILITY_KEY = "lpc_probability"
CONVERSATION_KEY = "lpc_conversation_id"
USER_PROMPTS_KEY = "lpc_user_prompts"
TURN_COUNT_KEY = "lpc_turn_count"
SIGNATURE_KEY = "lpc_signature"
MAX_SIGNATURE_CHARS = 128

MAX_CONVERSATION_ID_CHARS = 256


@dataclass(frozen=True, slots=True)
class RequestHints:
    """The LPC fields of one request, validated; `problems` lists the fields that were not."""

    probability: float | None = None
    conversation_id: str | None = None
    user_prompts: tuple[str, ...] = ()
    turn_count: int | None = None
    problems: tuple[str, ...] = ()
    signature: str | None = None  # lpc_signature, unchecked (`trust.HintTrust` checks it)
    tenant: str = ""  # the request's tenant, set by the trust boundary (`trust.tenant_of`)

    @property
    def can_predict(self) -> bool:
        """Whether a predictor has what it needs (a conversation and its prompts)."""
        return self.conversation_id is not None and bool(self.user_prompts)

    def prediction_item(self, prompt_tokens: int | None = None) -> dict[str, Any]:
        """The predictor RPC's item: {conversation_id, user_prompts, turn_count}, plus
        `prompt_tokens` when given: the request's prompt tokens as the engine counts them,
        which a model trained with `log_prompt_tokens` needs (the engine knows the count, the
        API layer setting the hints does not, so it is not a hint)."""
        if not self.can_predict:
            raise ValueError("a prediction needs a conversation id and user prompts")
        turn_count = self.turn_count if self.turn_count is not None else len(self.user_prompts)
        item: dict[str, Any] = {
            "conversation_id": self.conversation_id,
            "user_prompts": list(self.user_prompts),
            "turn_count": max(turn_count, len(self.user_prompts)),
        }
        if prompt_tokens is not None:
            item["prompt_tokens"] = prompt_tokens
        return item


NO_HINTS = RequestHints()


def parse_hints(extra_args: Mapping[str, Any] | None) -> RequestHints:
    """Read LPC's fields from a request's extra arguments (None or no fields: no hints)."""
    if not extra_args:
        return NO_HINTS
    if not isinstance(extra_args, Mapping):
        return RequestHints(problems=(f"extra_args is a {type(extra_args).__name__}",))
    problems: list[str] = []

    probability = extra_args.get(PROBABILITY_KEY)
    if probability is not None and (
        isinstance(probability, bool)
        or not isinstance(probability, int | float)
        or math.isnan(probability)
        or not 0.0 <= probability <= 1.0
    ):
        problems.append(f"{PROBABILITY_KEY} must be a number in [0, 1], got {probability!r}")
        probability = None

    conversation_id = extra_args.get(CONVERSATION_KEY)
    if conversation_id is not None and (
        not isinstance(conversation_id, str)
        or not conversation_id
        or len(conversation_id) > MAX_CONVERSATION_ID_CHARS
    ):
        problems.append(
            f"{CONVERSATION_KEY} must be a non-empty string of at most "
            f"{MAX_CONVERSATION_ID_CHARS} characters, got {str(conversation_id)[:80]!r}"
        )
        conversation_id = None

    prompts = extra_args.get(USER_PROMPTS_KEY)
    user_prompts: tuple[str, ...] = ()
    if prompts is not None:
        if isinstance(prompts, list | tuple) and all(isinstance(p, str) for p in prompts):
            user_prompts = tuple(prompts)
        else:
            problems.append(f"{USER_PROMPTS_KEY} must be a list of strings")

    turn_count = extra_args.get(TURN_COUNT_KEY)
    if turn_count is not None and (
        isinstance(turn_count, bool) or not isinstance(turn_count, int) or turn_count < 1
    ):
        problems.append(f"{TURN_COUNT_KEY} must be an integer >= 1, got {turn_count!r}")
        turn_count = None

    signature = extra_args.get(SIGNATURE_KEY)
    if signature is not None and (
        not isinstance(signature, str) or not 0 < len(signature) <= MAX_SIGNATURE_CHARS
    ):
        problems.append(
            f"{SIGNATURE_KEY} must be a string of 1 to {MAX_SIGNATURE_CHARS} characters"
        )
        signature = None

    if probability is None and conversation_id is None and not user_prompts and not problems:
        return NO_HINTS
    return RequestHints(
        None if probability is None else float(probability),
        conversation_id,
        user_prompts,
        turn_count,
        tuple(problems),
        signature,
    )
