"""Synthetic conversations whose continuation is written in the prompts, for training tests.

A user prompt ends with a "go on" word when the conversation continues and with a "goodbye"
word when it is the last turn, except for a share of noisy turns: a predictor that reads the
text learns it, a turns-only one cannot, and a model trained badly is measurably worse.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from training.conversation import Conversation, Message

TOPICS = (
    "python",
    "cooking",
    "travel",
    "music",
    "finance",
    "garden",
    "physics",
    "poetry",
    "chess",
    "history",
    "football",
    "weather",
)
GO_ON = ("next", "then", "also")  # words that hash apart in the tests' fake embedder
GOODBYE = ("bye", "goodbye", "cheers")


def synthetic_conversations(
    count: int, seed: int = 0, prefix: str = "c", noise: float = 0.1
) -> list[Conversation]:
    rng = random.Random(seed)
    conversations = []
    for i in range(count):
        turns = rng.choice((1, 1, 2, 2, 3, 4, 5, 7))
        messages = []
        for k in range(turns):
            last = k == turns - 1
            says_last = last if rng.random() >= noise else not last
            marker = rng.choice(GOODBYE if says_last else GO_ON)
            words = rng.sample(TOPICS, 2)
            # the marker dominates the prompt, so a bag-of-words embedding carries it clearly
            messages.append(Message("user", " ".join([*words, marker, marker, marker])))
            messages.append(Message("assistant", "sure " * rng.randint(1, 20)))
        conversations.append(Conversation(f"{prefix}{i}", tuple(messages), source="synthetic"))
    return conversations


def write_openai_jsonl(path: Path, conversations: list[Conversation]) -> Path:
    """The conversations as an OpenAI-messages JSON Lines log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for c in conversations:
            handle.write(
                json.dumps(
                    {
                        "id": c.conversation_id,
                        "messages": [{"role": m.role, "content": m.content} for m in c.messages],
                    }
                )
                + "\n"
            )
    return path
