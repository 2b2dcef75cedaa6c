"""Conversations → the scripted turns a workload replays: tokens, labels, predictor input.

The A/B harness runs on the evaluation half of a data set, in a seeded random order, and only
tokenises the conversations the workload actually reaches (the paper's 20-minute window uses
a few hundred of the ~8,800 held-out ShareGPT chats), so a fresh run starts in seconds.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from lpc.chat_tokenization import DEFAULT_MAX_MODEL_LEN, ChatTemplate, conversation_tokens
from lpc.chat_tokenizers import ChatTokenizer
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
    result = load_conversations(source, format=data_format, **options)
    halves = partition_conversations(result.conversations)
    return SplitDataset(source, halves.train, halves.eval, result.report.summary())


def scripted_turns(
    conversation: Conversation, template: ChatTemplate, max_model_len: int
) -> list[ScriptedTurn]:
    """The conversation's kept turns (after the max_model_len cut) as workload turns."""
    tokens = conversation_tokens(conversation, template, max_model_len)
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


def lazily_scripted(
    conversations: Sequence[Conversation],
    tokenizer: ChatTokenizer,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> Iterator[list[ScriptedTurn]]:
    """Scripted conversations in the given order, tokenised only when the workload asks."""
    template = ChatTemplate(tokenizer)
    for conversation in conversations:
        turns = scripted_turns(conversation, template, max_model_len)
        if turns:
            yield turns


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
