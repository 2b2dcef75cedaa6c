"""The normalised conversation every loader produces and every consumer reads.

Real chat logs are messy (other role names, empty turns, two user messages in a row); loaders
clean them into this one shape and count what they changed, so nothing downstream guesses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"content must be str, got {type(self.content).__name__}")


@dataclass(frozen=True, slots=True)
class Conversation:
    """An ordered chat: optional system messages first, then user/assistant turns.

    `conversation_id` is stable across runs (it keys traces). `group_id` names the chat a
    conversation is a piece of when the data splits one chat into several records (ShareGPT's
    `X_0, X_1, …` segments, Chatbot-Arena's two answers to one question); pieces of one chat
    must land on the same side of the train/evaluation split, so the split reads `split_key`.
    """

    conversation_id: str
    messages: tuple[Message, ...]
    source: str = ""
    group_id: str | None = None

    @property
    def split_key(self) -> str:
        """What the train/evaluation split hashes: the group id, else the conversation id."""
        return self.group_id if self.group_id is not None else self.conversation_id

    def user_prompts(self) -> list[str]:
        """The user messages, oldest first."""
        return [m.content for m in self.messages if m.role == "user"]

    @property
    def num_user_turns(self) -> int:
        return sum(1 for m in self.messages if m.role == "user")
