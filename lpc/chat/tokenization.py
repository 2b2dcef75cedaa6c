"""Conversations → the token ids of the requests a serving engine would see, turn by turn.

Template (ChatML, `TEMPLATE_VERSION`): each message is `<|im_start|>{role}\\n{content}<|im_end|>`
and messages are separated by `\\n`. The request of user turn k has

    prompt  = every earlier message (system, user, assistant), templated and separated,
              + the new user message + `\\n<|im_start|>assistant\\n`
    output  = the reply's tokens + `<|im_end|>`

The `\\n` after `<|im_end|>` belongs to the next prompt, so prompt(k+1) starts with exactly
prompt(k) + output(k) + `\\n`: a conversation is one token sequence, and every request is a
prefix of it (what makes multi-turn prefix caching work). It is stored once per conversation
(`ConversationTokens.token_ids`); turns are lengths into it (no copies, linear memory).

Tokenisation follows the serving engine: the text between two special tokens is encoded as one
piece (`"user\\nHello"`), as tokenising the rendered template would; a reply is encoded on its
own, as the model generates it after the header, and the next prompt reuses those very tokens.
(The two differ only for a reply that starts with a line break; the bundled ShareGPT has none.)
Each message is encoded once; building all turns costs time linear in the conversation.

A user turn without a reply (the conversation ends on a user message) gets the empty reply:
output = `<|im_end|>` alone, and `has_reply` is False.

Cut: a turn whose prompt + output exceeds `max_model_len` is dropped with every later turn
(later prompts only grow). `has_next_turn`, the continuation label, is computed on the turns
kept: the last kept turn has no next turn, as in the workload that is replayed.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

from tqdm import tqdm

from lpc.chat.tokenizers import ChatTokenizer, default_chat_tokenizer
from training.conversation import Conversation

TEMPLATE_VERSION = "chatml-v1"
DEFAULT_MAX_MODEL_LEN = 32768
TOKEN_TYPECODE = "I"  # unsigned 32-bit: any vocabulary fits, 4 bytes a token
assert array(TOKEN_TYPECODE).itemsize == 4, "array('I') must hold 32-bit token ids"


@dataclass(frozen=True, slots=True)
class TurnTokens:
    """One user turn's request: prompt and output, as views into the conversation's tokens.

    `turn_index` counts user turns from 0 (`conversation.user_prompts()[turn_index]` is its
    text). `num_turns_kept` counts the conversation's turns after the `max_model_len` cut, and
    `has_next_turn` (the continuation label) is `turn_index < num_turns_kept - 1`.
    `conversation_token_ids` is shared by all turns of the conversation; never modify it.
    """

    conversation_id: str
    split_key: str
    turn_index: int
    num_prompt_tokens: int
    num_output_tokens: int
    num_turns_kept: int
    has_next_turn: bool
    has_reply: bool
    conversation_token_ids: memoryview = field(hash=False)  # a memoryview of ints is unhashable

    @property
    def prompt_token_ids(self) -> memoryview:
        return self.conversation_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> memoryview:
        return self.conversation_token_ids[self.num_prompt_tokens : self.num_request_tokens]

    @property
    def request_token_ids(self) -> memoryview:
        """Prompt then output: what the request holds in the KV cache when it finishes."""
        return self.conversation_token_ids[: self.num_request_tokens]

    @property
    def num_request_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


@dataclass(frozen=True, slots=True)
class ConversationTokens:
    """A conversation's kept turns and the one token sequence they are all prefixes of.

    `token_ids` ends with the last kept turn's output. `num_user_turns` counts the user turns
    before the cut, so `num_turns_dropped` is what the cut removed.
    """

    conversation_id: str
    split_key: str
    token_ids: memoryview = field(hash=False)
    turns: tuple[TurnTokens, ...]
    num_user_turns: int

    @property
    def num_turns_dropped(self) -> int:
        return self.num_user_turns - len(self.turns)


@dataclass(frozen=True, slots=True)
class TokenizationReport:
    """What tokenising a set of conversations kept and dropped, and how many tokens it made.

    Conversations: `conversations_kept` have at least one turn (`conversations_cut` of them
    lost later turns to the cut), `conversations_dropped` lost all (their first request alone
    is too long) and are not in the output. Tokens: `prompt_tokens` and `output_tokens` sum
    over kept turns (what a replay queries and generates); `stored_tokens` is what is stored,
    one sequence per conversation.
    """

    tokenizer_name: str
    tokenizer_fingerprint: str
    template_version: str
    max_model_len: int
    conversations: int = 0
    conversations_kept: int = 0
    conversations_cut: int = 0
    conversations_dropped: int = 0
    user_turns: int = 0
    turns_kept: int = 0
    turns_dropped: int = 0
    turns_without_reply: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    stored_tokens: int = 0

    def summary(self) -> str:
        return (
            f"{self.tokenizer_name}, {self.template_version}, max_model_len "
            f"{self.max_model_len}: {self.conversations} conversations → "
            f"{self.conversations_kept} kept ({self.conversations_cut} cut, "
            f"{self.conversations_dropped} dropped); {self.user_turns} user turns → "
            f"{self.turns_kept} kept, {self.turns_dropped} dropped, "
            f"{self.turns_without_reply} without reply; {self.prompt_tokens} prompt + "
            f"{self.output_tokens} output tokens ({self.stored_tokens} stored)"
        )


@dataclass(frozen=True, slots=True)
class TokenizedConversations:
    """The tokenised conversations (in input order, those with a kept turn) and the report."""

    conversations: list[ConversationTokens]
    report: TokenizationReport
    from_cache: bool = False

    @property
    def turns(self) -> list[TurnTokens]:
        """Every kept turn, conversation by conversation, in turn order."""
        return [turn for conversation in self.conversations for turn in conversation.turns]


class ChatTemplate:
    """The ChatML pieces in one tokenizer's ids, computed once."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self.im_start = tokenizer.im_start_id
        self.im_end = tokenizer.im_end_id
        self.separator = tokenizer.encode("\n")
        self.assistant_header = [self.im_start, *tokenizer.encode("assistant\n")]

    def message(self, role: str, content: str) -> list[int]:
        """`<|im_start|>{role}\\n{content}<|im_end|>` with role and content encoded together."""
        return [self.im_start, *self.tokenizer.encode(f"{role}\n{content}"), self.im_end]

    def reply(self, content: str | None) -> list[int]:
        """A turn's output: the reply as generated after the header, then `<|im_end|>`."""
        if content is None:
            return [self.im_end]
        return [*self.tokenizer.encode(content), self.im_end]


def check_max_model_len(max_model_len: int) -> None:
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")


def conversation_tokens(
    conversation: Conversation,
    template: ChatTemplate,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> ConversationTokens:
    """Tokenise one conversation into its kept turns (see the module docstring for the rules)."""
    check_max_model_len(max_model_len)
    messages = conversation.messages
    tokens = array(TOKEN_TYPECODE)
    bounds: list[tuple[int, int, bool]] = []  # (prompt tokens, output tokens, has reply)
    i = 0
    while i < len(messages):
        message = messages[i]
        if tokens:
            tokens.extend(template.separator)
        if message.role != "user":
            tokens.extend(template.message(message.role, message.content))
            i += 1
        else:
            tokens.extend(template.message("user", message.content))
            tokens.extend(template.separator)
            tokens.extend(template.assistant_header)
            num_prompt = len(tokens)
            has_reply = i + 1 < len(messages) and messages[i + 1].role == "assistant"
            output = template.reply(messages[i + 1].content if has_reply else None)
            if num_prompt + len(output) > max_model_len:
                break
            tokens.extend(output)
            bounds.append((num_prompt, len(output), has_reply))
            i += 2 if has_reply else 1
        if len(tokens) >= max_model_len:
            break  # no later prompt can fit: spare the encoding
    if bounds:
        end = bounds[-1][0] + bounds[-1][1]
        del tokens[end:]
    else:
        del tokens[:]
    view = memoryview(tokens).toreadonly()
    kept = len(bounds)
    split_key = conversation.split_key
    turns = tuple(
        TurnTokens(
            conversation.conversation_id,
            split_key,
            k,
            num_prompt,
            num_output,
            kept,
            k < kept - 1,
            has_reply,
            view,
        )
        for k, (num_prompt, num_output, has_reply) in enumerate(bounds)
    )
    return ConversationTokens(
        conversation.conversation_id, split_key, view, turns, conversation.num_user_turns
    )


def tokenize_conversation(
    conversation: Conversation,
    tokenizer: ChatTokenizer | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> list[TurnTokens]:
    """The kept turns of one conversation (empty when even the first request is too long).

    For many conversations use `tokenize_conversations`, which builds the template once.
    """
    template = ChatTemplate(tokenizer if tokenizer is not None else default_chat_tokenizer())
    return list(conversation_tokens(conversation, template, max_model_len).turns)


def tokenize_conversations(
    conversations: Iterable[Conversation],
    tokenizer: ChatTokenizer | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    progress: bool = True,
) -> TokenizedConversations:
    """Tokenise many conversations, with a progress bar, counting what the cut dropped."""
    check_max_model_len(max_model_len)
    tokenizer = tokenizer if tokenizer is not None else default_chat_tokenizer()
    template = ChatTemplate(tokenizer)
    kept: list[ConversationTokens] = []
    counts = dict.fromkeys(
        (
            "conversations",
            "conversations_kept",
            "conversations_cut",
            "conversations_dropped",
            "user_turns",
            "turns_kept",
            "turns_dropped",
            "turns_without_reply",
            "prompt_tokens",
            "output_tokens",
            "stored_tokens",
        ),
        0,
    )
    total = len(conversations) if hasattr(conversations, "__len__") else None
    for conversation in tqdm(
        conversations, total=total, desc="tokenising", unit="conv", disable=not progress
    ):
        tokens = conversation_tokens(conversation, template, max_model_len)
        counts["conversations"] += 1
        counts["user_turns"] += tokens.num_user_turns
        counts["turns_kept"] += len(tokens.turns)
        counts["turns_dropped"] += tokens.num_turns_dropped
        if not tokens.turns:
            counts["conversations_dropped"] += 1
            continue
        counts["conversations_kept"] += 1
        counts["conversations_cut"] += tokens.num_turns_dropped > 0
        counts["stored_tokens"] += len(tokens.token_ids)
        for turn in tokens.turns:
            counts["prompt_tokens"] += turn.num_prompt_tokens
            counts["output_tokens"] += turn.num_output_tokens
            counts["turns_without_reply"] += not turn.has_reply
        kept.append(tokens)
    report = TokenizationReport(
        tokenizer.name, tokenizer.fingerprint, TEMPLATE_VERSION, max_model_len, **counts
    )
    return TokenizedConversations(kept, report)
