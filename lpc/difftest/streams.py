"""Seeded request streams that look like multi-tenant multi-turn chat, for differential tests.

Every stream is a deterministic function of its seed (`random.Random(seed)`, no global state).
It mixes what makes a prefix cache interesting:
- a few shared system prompts, and popular first questions, so unrelated conversations share
  prefixes;
- conversations whose next prompt is exactly the previous prompt + output + a new user message,
  branches that extend an earlier turn instead of the last one, and resends of an earlier
  prompt (with the same output, as greedy decoding gives, or another one), which exercise the
  "recompute the last prompt token" cap and duplicate cached blocks;
- a `cache_salt` on some conversations, with the same system prompts under several salts and
  none, so isolation between salts is put to the test;
- lengths that are not multiples of the block size;
- frees in random order (not FIFO) and a pool small enough that cached blocks are evicted and
  some allocations fail.
The generator does not simulate the cache: a request whose allocation fails is still freed
later, which both replays treat as a no-op.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lpc.difftest.ops import FreeRequest, NewRequest, Stream, StreamStart


@dataclass(frozen=True, slots=True)
class StreamParams:
    """Shape of a stream. Lengths are in tokens, drawn uniformly from the inclusive ranges."""

    steps: int = 2000
    block_size: int = 4
    num_blocks: int = 64
    vocab_size: int = 1000
    num_system_prompts: int = 4
    system_len: tuple[int, int] = (3, 30)
    user_len: tuple[int, int] = (1, 14)
    output_len: tuple[int, int] = (0, 14)
    num_popular_questions: int = 3
    salts: tuple[str, ...] = ("tenant-a", "tenant-b", "tenant-c")
    salt_probability: float = 0.3
    max_active: int = 6
    # A conversation ends once its next prompt would exceed this share of the usable pool.
    max_share_of_pool: float = 0.6

    def __post_init__(self) -> None:
        if self.steps < 0 or self.block_size < 1 or self.num_blocks < 2 or self.max_active < 1:
            raise ValueError(f"invalid stream parameters: {self}")
        for name in ("system_len", "user_len", "output_len"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name} must be an increasing pair of lengths >= 0")
        if self.user_len[0] < 1:
            raise ValueError("user messages need at least one token")

    @property
    def max_sequence_tokens(self) -> int:
        return max(1, int((self.num_blocks - 1) * self.block_size * self.max_share_of_pool))


def params_for_seed(seed: int, steps: int = 2000) -> StreamParams:
    """Per-seed variety for the differential suite: block size, pool size and mix change."""
    rng = random.Random(f"lpc-difftest-params-{seed}")
    block_size = rng.choice((4, 4, 8, 16))
    scale = block_size / 4
    return StreamParams(
        steps=steps,
        block_size=block_size,
        num_blocks=rng.randint(40, 96),
        system_len=(int(3 * scale), int(30 * scale)),
        user_len=(1, int(14 * scale)),
        output_len=(0, int(14 * scale)),
        salt_probability=rng.choice((0.2, 0.3, 0.5)),
        max_active=rng.randint(4, 8),
    )


@dataclass(slots=True)
class _Conversation:
    salt: str | None
    # The full sequence (prompt + output) of every turn issued, in order.
    turns: list[tuple[int, ...]] = field(default_factory=list)
    # Every request of this conversation: (prompt, output), for resends.
    requests: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)


class _Generator:
    """One stream's state: open conversations and requests issued but not yet freed."""

    def __init__(self, params: StreamParams, seed: int) -> None:
        self.p = params
        self.rng = random.Random(seed)
        self.next_id = 0
        self.systems = [self._tokens(params.system_len) for _ in range(params.num_system_prompts)]
        self.popular = [self._tokens(params.user_len) for _ in range(params.num_popular_questions)]
        self.open: list[_Conversation] = []
        self.active: list[str] = []

    def _tokens(self, length: tuple[int, int]) -> tuple[int, ...]:
        n = self.rng.randint(*length)
        return tuple(self.rng.randrange(self.p.vocab_size) for _ in range(n))

    def _fits(self, prompt: tuple[int, ...], output: tuple[int, ...]) -> bool:
        return len(prompt) + len(output) <= self.p.max_sequence_tokens

    def _start(self) -> tuple[_Conversation, tuple[int, ...]]:
        rng = self.rng
        salt = rng.choice(self.p.salts) if rng.random() < self.p.salt_probability else None
        system = rng.choice(self.systems) if rng.random() < 0.85 else ()
        question = (
            rng.choice(self.popular) if rng.random() < 0.35 else self._tokens(self.p.user_len)
        )
        conversation = _Conversation(salt)
        self.open.append(conversation)
        return conversation, system + question

    def _next_request(self) -> NewRequest:
        rng = self.rng
        r = rng.random()
        conversation: _Conversation | None = None
        prompt: tuple[int, ...] = ()
        output: tuple[int, ...] | None = None
        if self.open and r < 0.75:
            # Recent conversations are likelier to go on.
            conversation = self.open[-1 - min(int(rng.expovariate(0.5)), len(self.open) - 1)]
            if r < 0.55 or len(conversation.turns) < 2:
                base = conversation.turns[-1]  # the next turn of the chat
            elif r < 0.65:
                base = rng.choice(conversation.turns[:-1])  # a branch from an earlier turn
            else:
                base = None  # a resend of an earlier prompt
            if base is None:
                prompt, previous = rng.choice(conversation.requests)
                output = previous if rng.random() < 0.5 else None
            else:
                prompt = base + self._tokens(self.p.user_len)
        if conversation is None or not self._fits(prompt, output or ()):
            if conversation is not None:
                self.open.remove(conversation)
            conversation, prompt = self._start()
            output = None
        if output is None:
            output = self._tokens(self.p.output_len)
        if not self._fits(prompt, output):
            output = output[: max(0, self.p.max_sequence_tokens - len(prompt))]
            prompt = prompt[: self.p.max_sequence_tokens]
        conversation.turns.append(prompt + output)
        conversation.requests.append((prompt, output))
        if len(self.open) > 12:
            self.open.pop(0)
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.active.append(rid)
        return NewRequest(rid, prompt, output, conversation.salt)

    def _free(self) -> FreeRequest:
        rid = self.active.pop(self.rng.randrange(len(self.active)))
        return FreeRequest(rid)

    def step(self) -> NewRequest | FreeRequest:
        n = len(self.active)
        if n == 0:
            return self._next_request()
        if n >= self.p.max_active:
            return self._free()
        free_probability = 0.2 + 0.6 * n / self.p.max_active
        return self._free() if self.rng.random() < free_probability else self._next_request()


def generate_stream(seed: int, params: StreamParams | None = None) -> Stream:
    """The stream of `params.steps` operations for `seed` (parameters from the seed if None)."""
    params = params if params is not None else params_for_seed(seed)
    generator = _Generator(params, seed)
    stream = Stream(StreamStart(f"seed-{seed}", params.num_blocks, params.block_size))
    stream.ops.extend(generator.step() for _ in range(params.steps))
    return stream
