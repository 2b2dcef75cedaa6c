"""MicroBatcher without HTTP: batch sizes, order, splitting, bounds, failures, draining, and
admission by work (the tokens each window costs)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from predictor.batching import BatcherStoppedError, MicroBatcher, QueueFullError
from predictor.features import ConversationWindow, FeatureConfig, WindowTextBuilder
from predictor.rpc_admission import MAX_CHARS_PER_TOKEN, WindowTokenEstimator
from tests.predictor.conftest import sample_windows
from tests.predictor.fakes import HashingEmbedder, WhitespaceTokenizer


def windows(n: int, tag: str = "w") -> list[ConversationWindow]:
    return [ConversationWindow(f"{tag}{i}", (f"prompt {tag}{i}",), i + 1) for i in range(n)]


class RecordingModel:
    """Probability = turn_count / 1000, so answers identify their window."""

    def __init__(
        self,
        delay_s: float = 0.0,
        fail_on: int | None = None,
        gate: threading.Event | None = None,
    ) -> None:
        self.batches: list[int] = []
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.gate = gate  # when given, every batch waits until the test opens it

    def predict(self, batch):
        self.batches.append(len(batch))
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("model exploded")
        if self.gate is not None and not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        time.sleep(self.delay_s)
        return np.array([w.turn_count / 1000 for w in batch])


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_requests_share_batches_and_keep_order():
    model = RecordingModel()

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=8, max_wait_s=0.05, max_queue_items=100
        )
        await batcher.start()
        groups = [windows(3, tag=f"g{k}-") for k in range(4)]
        answers = await asyncio.gather(*(batcher.submit(g) for g in groups))
        await batcher.stop()
        return groups, answers

    groups, answers = run(scenario())
    for group, answer in zip(groups, answers, strict=True):
        assert answer.tolist() == [w.turn_count / 1000 for w in group]
    assert model.batches == [8, 4]


def test_a_large_request_is_split_over_batches():
    model = RecordingModel()

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=4, max_wait_s=0.0, max_queue_items=100
        )
        await batcher.start()
        answer = await batcher.submit(windows(10))
        await batcher.stop()
        return answer

    assert run(scenario()).tolist() == [(i + 1) / 1000 for i in range(10)]
    assert model.batches == [4, 4, 2]


def test_queue_bound_refuses_whole_requests():
    model = RecordingModel(gate=threading.Event())

    async def scenario():
        depths = []
        batcher = MicroBatcher(
            lambda: model.predict,
            max_batch=2,
            max_wait_s=0.0,
            max_queue_items=5,
            on_queue_depth=depths.append,
        )
        await batcher.start()
        first = asyncio.ensure_future(batcher.submit(windows(2, "a")))
        while not model.batches:  # until the first batch runs (held at the gate)
            await asyncio.sleep(0.005)
        # the first batch is running, the queue is empty
        second = batcher.enqueue(windows(4, "b"))
        with pytest.raises(QueueFullError):
            batcher.enqueue(windows(2, "c"))
        assert batcher.queued_items == 4
        third = batcher.enqueue(windows(1, "d"))
        model.gate.set()
        await asyncio.gather(first, second, third)
        await batcher.stop()
        return depths

    depths = run(scenario())
    assert max(depths) == 5 and depths[-1] == 0


def test_a_failing_batch_fails_its_requests_only():
    model = RecordingModel(fail_on=1)

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=2, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        with pytest.raises(RuntimeError, match="exploded"):
            await batcher.submit(windows(2))
        answer = await batcher.submit(windows(1))
        await batcher.stop()
        return answer

    assert run(scenario()).tolist() == [0.001]


def test_cancelled_requests_are_not_computed():
    model = RecordingModel(delay_s=0.1)

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=1, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        first = batcher.enqueue(windows(1, "a"))
        await asyncio.sleep(0.02)
        doomed = batcher.enqueue(windows(3, "b"))
        doomed.cancel()
        await first
        await batcher.stop()

    run(scenario())
    assert model.batches == [1]


def test_stop_drains_the_queue_then_refuses():
    model = RecordingModel(delay_s=0.05)

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict, max_batch=2, max_wait_s=1.0, max_queue_items=10
        )
        await batcher.start()
        pending = [batcher.enqueue(windows(1, f"x{k}")) for k in range(5)]
        await batcher.stop()
        assert all(p.done() and not p.cancelled() for p in pending)
        with pytest.raises(BatcherStoppedError):
            batcher.enqueue(windows(1))

    run(scenario())
    assert sum(model.batches) == 5


def test_the_model_is_looked_up_per_batch():
    old, new = RecordingModel(), RecordingModel()
    current = {"model": old}

    async def scenario():
        batcher = MicroBatcher(
            lambda: current["model"].predict, max_batch=4, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        await batcher.submit(windows(2))
        current["model"] = new
        await batcher.submit(windows(3))
        await batcher.stop()

    run(scenario())
    assert old.batches == [2] and new.batches == [3]


def test_wrong_answer_length_is_an_error():
    async def scenario():
        batcher = MicroBatcher(
            lambda: lambda batch: np.zeros(1), max_batch=4, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        with pytest.raises(RuntimeError, match="returned 1 probabilities for 2"):
            await batcher.submit(windows(2))
        await batcher.stop()

    run(scenario())


def test_requests_that_would_time_out_are_refused_up_front():
    model = RecordingModel(delay_s=0.05)  # 0.05 s per batch of 1 window

    async def scenario():
        batcher = MicroBatcher(
            lambda: model.predict,
            max_batch=1,
            max_wait_s=0.0,
            max_queue_items=100,
            max_expected_wait_s=0.3,
        )
        await batcher.start()
        await batcher.submit(windows(1))  # measures >= 0.05 s per window (more under load)
        assert batcher.seconds_per_window is not None
        pending = []
        with pytest.raises(QueueFullError, match="expected wait"):
            for k in range(20):
                pending.append(batcher.enqueue(windows(1, f"r{k}")))
        # At >= 0.05 s a window, at most 6 fit in 0.3 s: refused long before the count bound
        # of 100, however slow the machine (a slower one measures more per window and admits
        # fewer; the idle batcher admits the first whatever its speed).
        assert 1 <= batcher.queued_items <= 6
        await asyncio.gather(*pending)
        await batcher.stop()

    run(scenario())


class TokenTimedModel:
    """Takes `seconds_per_token` × the tokens of each window (one token per character of its
    conversation id, so tests choose a window's cost by naming it)."""

    def __init__(self, seconds_per_token: float) -> None:
        self.seconds_per_token = seconds_per_token
        self.batches: list[int] = []
        self.started_at: list[float] = []  # time.monotonic() as each batch began

    def predict(self, batch):
        self.started_at.append(time.monotonic())
        self.batches.append(len(batch))
        time.sleep(self.seconds_per_token * sum(len(w.conversation_id) for w in batch))
        return np.array([w.turn_count / 1000 for w in batch])


class HeldModel(TokenTimedModel):
    """A batch that runs until the test sets `release`: on the worker for as long as the test
    needs, however loaded the machine (a sleep's length could run out first)."""

    def __init__(self) -> None:
        super().__init__(seconds_per_token=0.0)
        self.release = threading.Event()

    def predict(self, batch):
        self.started_at.append(time.monotonic())
        self.batches.append(len(batch))
        if not self.release.wait(timeout=60):
            raise TimeoutError("the test never released the batch")
        return np.array([w.turn_count / 1000 for w in batch])


async def started_batcher(
    model: TokenTimedModel, *, max_batch: int, max_queue_items: int, max_expected_wait_s: float
) -> MicroBatcher:
    """A started batcher over `model`, batching at once (no wait for more windows)."""
    batcher = MicroBatcher(
        lambda: model.predict,
        max_batch=max_batch,
        max_wait_s=0.0,
        max_queue_items=max_queue_items,
        max_expected_wait_s=max_expected_wait_s,
    )
    await batcher.start()
    return batcher


def sized(n: int, tokens: int, tag: str) -> list[ConversationWindow]:
    return [ConversationWindow(f"{tag}{i}".ljust(tokens, "."), ("p",), i + 1) for i in range(n)]


def cost(windows_: list[ConversationWindow]) -> list[int]:
    return [len(w.conversation_id) for w in windows_]


def test_admission_counts_tokens_so_long_windows_learned_on_short_ones_are_refused():
    """Speed learned on 10-token windows; a burst of 1,000-token requests is then admitted
    only as far as their tokens fit in the bound at that speed. Counted in windows (two per
    request, far below the 1,000-window bound), all of them would be."""
    model = TokenTimedModel(seconds_per_token=1e-4)

    async def scenario():
        batcher = await started_batcher(
            model, max_batch=4, max_queue_items=1000, max_expected_wait_s=5.0
        )
        for k in range(5):
            short = sized(4, 10, f"s{k}-")
            await batcher.submit(short, cost(short))
        learned = batcher.seconds_per_token
        admitted, reasons = [], []
        for k in range(100):  # no await in between: nothing runs, nothing is learned
            burst = sized(2, 500, f"l{k}-")
            try:
                admitted.append(batcher.enqueue(burst, cost(burst)))
            except QueueFullError as full:
                reasons.append(str(full))
        queued_tokens = batcher.queued_tokens
        for pending in admitted:  # not computed: the test is about admission
            pending.cancel()
        await batcher.stop()
        return learned, len(admitted), reasons, queued_tokens

    learned, admitted, reasons, queued_tokens = run(scenario())
    assert learned >= 1e-4  # sleeping never takes less than asked
    fits = 0
    while 0.0 + (fits * 1000 + 1000) * learned <= 5.0:  # the rule, with the learned speed
        fits += 1
    assert admitted == fits < 100 and queued_tokens == 1000 * fits
    assert len(reasons) == 100 - fits and all("expected wait" in r for r in reasons)


def test_an_idle_batcher_admits_a_request_its_learned_speed_overstates():
    """A speed learned on short windows (a batch's fixed cost over few tokens) can make one
    long request look longer than the bound on its own. Refused on an idle server, it would
    be refused for ever (only its own batch could correct the speed); admitted, it runs and
    the speed falls. Behind it, the bound applies as before."""
    model = TokenTimedModel(seconds_per_token=1e-5)

    async def scenario():
        batcher = await started_batcher(
            model, max_batch=4, max_queue_items=1000, max_expected_wait_s=0.5
        )
        batcher.seconds_per_token = 1e-3  # as if learned on short, overhead-bound batches
        long_ = sized(2, 500, "a")
        assert batcher.expected_wait_s(1000) > batcher.max_expected_wait_s
        first = batcher.enqueue(long_, cost(long_))  # idle: admitted
        with pytest.raises(QueueFullError, match="expected wait"):
            batcher.enqueue(sized(2, 500, "b"), [500, 500])  # behind it: the bound applies
        probabilities = await first
        learned = batcher.seconds_per_token
        again = sized(2, 500, "c")
        second = batcher.enqueue(again, cost(again))  # idle again: admitted
        await second
        await batcher.stop()
        return probabilities, learned

    probabilities, learned = run(scenario())
    assert len(probabilities) == 2
    assert learned < 1e-3  # the long batch ran and pulled the speed towards its own


def test_windows_default_to_one_token_each_and_costs_are_checked():
    async def scenario():
        batcher = MicroBatcher(
            lambda: RecordingModel().predict, max_batch=2, max_wait_s=0.0, max_queue_items=10
        )
        await batcher.start()
        with pytest.raises(ValueError, match="tokens must be 2 integers >= 1"):
            batcher.enqueue(windows(2), [1])
        with pytest.raises(ValueError, match="tokens must be 2 integers >= 1"):
            batcher.enqueue(windows(2), [3, 0])
        pending = batcher.enqueue(windows(3))
        assert batcher.queued_tokens == 3
        await pending
        assert batcher.queued_tokens == 0
        await batcher.stop()

    run(scenario())


def test_a_running_batch_slower_than_learned_raises_the_estimate():
    """The estimate never assumes less than the batch on the worker has already taken per
    token, so a model that slows down is refused from before its slow batch finishes."""
    model = HeldModel()  # a 20-token batch, held on the worker until released

    async def scenario():
        batcher = await started_batcher(
            model, max_batch=1, max_queue_items=100, max_expected_wait_s=10.0
        )
        batcher.seconds_per_token = 1e-4  # as if learned on a faster model
        slow = batcher.enqueue(sized(1, 20, "b"), [20])
        while not model.started_at:  # the batch is on the worker
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        # The batcher's clock started before the model's, so it has seen at least this much.
        taken = time.monotonic() - model.started_at[0]
        during = batcher.expected_wait_s(100)
        average = batcher.seconds_per_token
        model.release.set()
        await slow
        await batcher.stop()
        return during, average, taken

    during, average, taken = run(scenario())
    assert average == 1e-4, "the slow batch finished before the check: nothing was tested"
    # What the running batch has already taken per token, times 100 tokens: not 100 x 1e-4.
    assert during >= 100 * taken / 20 > 0.9  # taken: the 0.2 s slept, at least


# -- the cost of a window: WindowTokenEstimator --------------------------------------------
@pytest.mark.parametrize(
    "config",
    [
        FeatureConfig(),
        FeatureConfig(share_policy="redistribute"),
        FeatureConfig(token_budget=64),
    ],
    ids=["even", "redistribute", "small-budget"],
)
def test_window_tokens_match_the_built_embedder_inputs(config):
    embedder = HashingEmbedder()
    estimator = WindowTokenEstimator.for_model(config, embedder.tokenizer, 512)
    rng = np.random.default_rng(5)
    vocabulary = ["cache", "prefix", "block", "why", "代码", "évict"]
    mixed = sample_windows(60, seed=4) + [
        ConversationWindow(
            f"m{i}",
            tuple(" ".join(rng.choice(vocabulary, size=rng.integers(0, 400))) for _ in range(6)),
            9,
        )
        for i in range(60)
    ]
    built = WindowTextBuilder(config, embedder.tokenizer, 512).build(mixed)
    actual = np.array(embedder.tokenizer.count_input_tokens(built))
    estimated = estimator.window_tokens(mixed)
    assert estimated.dtype == np.int64 and np.all(estimated >= 3)
    # Exact here: the separators and elisions are whitespace, no tokens to this tokenizer
    # (a subword tokenizer may count a few more at the joins).
    assert estimated.tolist() == actual.tolist()


def test_prompt_mean_windows_pay_the_overhead_per_prompt_and_long_prompts_their_share():
    embedder = HashingEmbedder()
    config = FeatureConfig(window_encoding="prompt_mean")
    estimator = WindowTokenEstimator.for_model(config, embedder.tokenizer, 512)
    share = (512 - 3) // 5
    two = ConversationWindow("c", ("a b c", "d e"), 2)
    assert estimator.window_tokens([two]).tolist() == [(3 + 3) + (3 + 2)]
    # Longer than share x MAX_CHARS_PER_TOKEN characters: charged the share, not tokenized
    # (one "word" here, one token, so the estimate is an upper bound).
    huge = ConversationWindow("h", ("x" * (share * MAX_CHARS_PER_TOKEN + 1),), 1)
    assert estimator.window_tokens([huge]).tolist() == [3 + share]
    assert estimator.chars_to_count([huge, two]) == len("a b c") + len("d e")


def test_a_failing_tokenizer_charges_the_most_a_window_can_cost():
    class BusyTokenizer(WhitespaceTokenizer):
        calls = 0

        def count_input_tokens(self, texts):
            self.calls += 1
            if self.calls > 1:  # the first call (the overhead) works
                raise RuntimeError("Already borrowed")
            return super().count_input_tokens(texts)

    estimator = WindowTokenEstimator.for_model(FeatureConfig(), BusyTokenizer(), 512)
    window = ConversationWindow("c", ("a", "b"), 2)
    assert estimator.window_tokens([window]).tolist() == [3 + 2 * ((512 - 3) // 5)]
