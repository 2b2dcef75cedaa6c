"""Conversations → the scripted turns a workload replays: tokens, labels, predictor input.

The A/B harness runs on the evaluation half of a data set, in a seeded random order; the
workload pulls conversations one by one until its window is full.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from lpc.chat.token_cache import tokenize_conversations_cached
from lpc.chat.tokenization import DEFAULT_MAX_MODEL_LEN, ChatTemplate, ConversationTokens
from lpc.chat.tokenizers import ChatTokenizer
from lpc.workload import ScriptedTurn
from training.conversation import Conversation
from training.loaders import load_conversations
from training.split import partition_conversations

PREDICTOR_WINDOW = 5  # the current user prompt and the 4 before it (the paper's N = 4)


@dataclass(frozen=True)
class SplitDataset:
    """A data set's two halves, as `training.split` assigns them."""

    source: str
    train: list[Conversation]
    eval: list[Conversation]
    load_summary: str


def load_split(
    source: str, data_format: str | None = None, mode: str | None = None
) -> SplitDataset:
    """Load conversations (bundled ShareGPT: `source="sharegpt"`) and split them in halves."""
    options = {} if mode is None else {"mode": mode}
    result = load_conversations(source, format=data_format, **options).require_conversations()
    halves = partition_conversations(result.conversations)
    return SplitDataset(source, halves.train, halves.eval, result.report.summary())


def scripted_turns(conversation: Conversation, tokens: ConversationTokens) -> list[ScriptedTurn]:
    """The conversation's kept turns (after the max_model_len cut) as workload turns."""
    prompts = conversation.user_prompts()
    return [
        ScriptedTurn(
            conversation_id=turn.conversation_id,
            turn_index=turn.turn_index,
            token_ids=turn.request_token_ids,
            num_prompt_tokens=turn.num_prompt_tokens,
            has_next_turn=turn.has_next_turn,
            user_prompts=tuple(
                prompts[max(0, turn.turn_index + 1 - PREDICTOR_WINDOW) : turn.turn_index + 1]
            ),
        )
        for turn in tokens.turns
    ]


def shuffled(conversations: Sequence[Conversation], seed: int) -> list[Conversation]:
    order = list(conversations)
    random.Random(seed).shuffle(order)
    return order


def scripted_conversations(
    conversations: Sequence[Conversation],
    tokenizer: ChatTokenizer,
    seed: int,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    progress: bool = True,
) -> Iterator[list[ScriptedTurn]]:
    """The conversations in a seeded random order, tokenised through the on-disk cache.

    The cache is keyed by the conversations in their given (file) order, so every seed and
    every run reuses one tokenisation: the first run on a fresh machine pays ~10 s for the
    ShareGPT evaluation half, later ones read it back in about a second.
    """
    tokenized = tokenize_conversations_cached(
        conversations, tokenizer, max_model_len, progress=progress
    )
    by_id = {tokens.conversation_id: tokens for tokens in tokenized.conversations}
    for conversation in shuffled(conversations, seed):
        tokens = by_id.get(conversation.conversation_id)
        if tokens is not None and tokens.turns:
            yield scripted_turns(conversation, tokens)


def message_tokenizer(tokenizer: ChatTokenizer):
    """(messages, reply) → (prompt ids, output ids) with the same template, for chat traces."""
    template = ChatTemplate(tokenizer)

    def tokenize(messages: list[dict[str, str]], reply: str) -> tuple[list[int], list[int]]:
        prompt: list[int] = []
        for message in messages:
            if prompt:
                prompt.extend(template.separator)
            prompt.extend(template.message(message["role"], message["content"]))
        prompt.extend(template.separator)
        prompt.extend(template.assistant_header)
        return prompt, template.reply(reply)

    return tokenize
