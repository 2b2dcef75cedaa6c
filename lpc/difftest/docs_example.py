"""The example of vLLM's "Automatic Prefix Caching" design doc, as a replayable stream.

Block size 4. The doc's pool has 10 blocks; vLLM 0.33.0 takes block 0 as its null block, so the
stream has 11 and every block id is the doc's plus one. The doc decodes request 0 token by
token; our one-shot API allocates prompt and output at once, so request 0 holds the doc's final
17 tokens (15 prompt + 2 output). `tests/test_docs_example.py` states what happens step by step
and how it differs from the doc's text; the vLLM differential suite replays the same stream on
vLLM itself.
"""

from __future__ import annotations

from lpc.difftest.ops import FreeRequest, NewRequest, Stream, StreamStart

BLOCK_SIZE = 4
NUM_BLOCKS = 11  # the doc's 10 + vLLM's null block

# Request 0: 15 prompt tokens, then decoding fills block 3 and needs a 5th block (2 outputs).
REQUEST_0_PROMPT = tuple(range(15))
REQUEST_0_OUTPUT = (15, 16)
# Request 1: 14 prompt tokens whose first 10 are request 0's.
REQUEST_1_PROMPT = (*range(10), 110, 111, 112, 113)
# Request 2: 29 prompt tokens whose first 12 are request 0's.
REQUEST_2_SHARED = tuple(range(12))
# Request 3 (not in the doc): a new, unrelated prompt that needs two blocks.
REQUEST_3_PROMPT = (300, 301, 302, 303, 304)


def request_2_prompt(num_tokens: int = 29) -> tuple[int, ...]:
    """Request 2's prompt: request 0's first 12 tokens, then new ones up to `num_tokens`."""
    if num_tokens <= len(REQUEST_2_SHARED):
        raise ValueError(f"request 2 needs more than {len(REQUEST_2_SHARED)} tokens")
    return REQUEST_2_SHARED + tuple(range(200, 200 + num_tokens - len(REQUEST_2_SHARED)))


def docs_example_stream(request_2_tokens: int = 29, with_request_3: bool = True) -> Stream:
    """Times 1-6 of the doc (request 0, request 1, free 0, free 1, request 2), then request 3."""
    ops: list[NewRequest | FreeRequest] = [
        NewRequest("0", REQUEST_0_PROMPT, REQUEST_0_OUTPUT),
        NewRequest("1", REQUEST_1_PROMPT),
        FreeRequest("0"),
        FreeRequest("1"),
        NewRequest("2", request_2_prompt(request_2_tokens)),
    ]
    if with_request_3:
        ops.append(NewRequest("3", REQUEST_3_PROMPT))
    name = f"docs-example-r2-{request_2_tokens}"
    return Stream(StreamStart(name, NUM_BLOCKS, BLOCK_SIZE), ops)
