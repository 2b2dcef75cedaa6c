"""A prediction that comes back after its request released its blocks re-keys the release.

The board keeps a released request's entry while its answer is on its way and hands the
answer to `on_late`; the free queues drain it at their next pop and re-key the release's own
runs, so the blocks go where a prediction in time would have put them. The fake client holds
its answer at a gate the test opens, and the board's worker is joined (`close`) before the
pop: nothing here depends on timing.
"""

from __future__ import annotations

from typing import Any

from lpc.integrations.config import PluginConfig
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.predictions import PredictionBoard
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_queue import QueueRuntime, bind_queue_class
from tests.integrations.pool_blocks import Block, Pool
from tests.integrations.test_plugin_runtime import Params, Request
from tests.integrations.test_predictions import FakeClient, item


def test_a_late_answer_goes_to_on_late_and_a_failed_one_nowhere() -> None:
    stats = PluginStats()
    # A call holding conversation "b" fails (None); others answer 0.25 per item.
    client = FakeClient(
        lambda items: None if any(i["conversation_id"] == "b" for i in items) else [0.25]
    )
    client.gate.clear()
    delivered: list[tuple[str, float]] = []
    board = PredictionBoard(client, stats, on_late=lambda rid, p: delivered.append((rid, p)))
    board.ask("r1", item("a"))
    assert client.entered.wait(10)  # r1's call is held at the gate; r2 goes in the next
    board.ask("r2", item("b"))
    assert board.claim("r1") == (None, True)  # on its way: kept for on_late
    assert board.claim("r1") == (None, False)  # claimed again: still delivered once
    assert board.claim("r2") == (None, True)
    assert stats.predictions_late == 2 and board.in_flight == 2
    client.gate.set()
    board.close()
    assert delivered == [("r1", 0.25)]  # r2's call failed: nothing to deliver
    assert board.pending == 0 and stats.predictor_failures == 1


def plugin(p: float) -> tuple[PluginRuntime, Any, FakeClient]:
    """A plugin runtime whose predictor answers `p` once its gate opens, and an LPC queue."""
    stats = PluginStats()
    config = PluginConfig(evictor="lpc", stats_log_interval_s=0.0)
    queues = QueueRuntime(config, stats, clock=lambda: 0.0, mode=ModeSwitch("lpc"))
    client = FakeClient(lambda items: [p] * len(items))
    client.gate.clear()
    board = PredictionBoard(client, stats, on_late=queues.late.deliver)
    runtime = PluginRuntime(config, stats, queues, client, board)
    pool = Pool()
    blocks = [Block(i, pool) for i in range(8)]
    pool.free_block_queue = bind_queue_class(queues)(blocks)
    return runtime, pool.free_block_queue, client


def release(runtime: PluginRuntime, queue: Any, request: Request, chain: list[Any]) -> None:
    for depth, block in enumerate(chain):
        block.ref_cnt = 0
        block.block_hash = bytes([depth, block.block_id])
        block.block_hash_num_tokens = 16 * (depth + 1)
    with runtime.queues.releasing(runtime.release_for(request)):
        queue.append_n(chain[::-1])


def order_after(p: float, late: bool) -> tuple[list[int], PluginStats]:
    """Request `old` (p from the predictor) releases blocks 0-3 at t = 0, then request `new`
    releases blocks 4-7 at t = 0 with no prediction (the fallback p, 0.5): the free order
    then, with `old`'s answer in time or after its release."""
    runtime, queue, client = plugin(p)
    clock = [0.0]
    runtime.queues.clock = lambda: clock[0]
    old = Request("old", Params({"lpc_conversation_id": "a", "lpc_user_prompts": ["hi"]}))
    new = Request("new")
    runtime.on_scheduled(old)
    chains = [queue.popleft_n(4), queue.popleft_n(4)]
    for block in chains[0] + chains[1]:
        block.ref_cnt = 1
    if not late:
        client.gate.set()
        runtime.board.close()
    assert client.entered.wait(10)
    release(runtime, queue, old, chains[0])
    clock[0] = 1.0
    release(runtime, queue, new, chains[1])
    if late:
        client.gate.set()
        runtime.board.close()  # the answer is delivered: the next pop re-keys
    order = [block.block_id for block in queue.popleft_n(8)]
    return order, runtime.stats


def test_a_late_prediction_puts_the_blocks_where_one_in_time_would() -> None:
    for p, expected in ((0.9, [7, 6, 5, 4, 3, 2, 1, 0]), (0.05, [3, 2, 1, 0, 7, 6, 5, 4])):
        in_time, in_time_stats = order_after(p, late=False)
        late, late_stats = order_after(p, late=True)
        assert in_time == late == expected, p
        assert in_time_stats.predictions_used == 1 and in_time_stats.late_predictions_used == 0
        assert late_stats.predictions_late == 1 and late_stats.fallbacks_used == 2
        assert late_stats.late_predictions_used == 1 and late_stats.late_runs_rekeyed == 1
    # Without the late answer both releases sit at the fallback p: LRU's order.
    runtime, queue, client = plugin(0.9)
    old = Request("old", Params({"lpc_conversation_id": "a", "lpc_user_prompts": ["hi"]}))
    runtime.on_scheduled(old)
    chain = queue.popleft_n(4)
    for block in chain:
        block.ref_cnt = 1
    assert client.entered.wait(10)
    release(runtime, queue, old, chain)
    assert runtime.stats.predictions_late == 1
    client.gate.set()
    runtime.board.close()
    runtime.queues.late.inboxes[0].clear()  # the answer lost: nothing re-keyed
    queue.popleft_n(4)
    assert runtime.stats.late_predictions_used == 0


def test_a_request_never_asked_for_is_asked_at_its_release_and_re_keyed() -> None:
    """The seam path has no scheduling hook: the release asks, queues the blocks at the
    fallback p, and the answer re-keys them at the next pop."""
    runtime, queue, client = plugin(0.9)
    old = Request("old", Params({"lpc_conversation_id": "a", "lpc_user_prompts": ["hi"]}))
    chains = [queue.popleft_n(4), queue.popleft_n(4)]
    for block in chains[0] + chains[1]:
        block.ref_cnt = 1
    release(runtime, queue, old, chains[0])  # asked here, not at scheduling
    runtime.queues.clock = lambda: 1.0
    release(runtime, queue, Request("new"), chains[1])
    assert runtime.stats.predictions_requested == 1 and runtime.stats.predictions_late == 1
    client.gate.set()
    runtime.board.close()
    assert [block.block_id for block in queue.popleft_n(8)] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert runtime.stats.late_predictions_used == 1
