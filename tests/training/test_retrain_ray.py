"""The daily job reads a fleet's sharded request logs on a local Ray: the same trace, the same
request table and samples, the same model as the serial read.

The logs: the head of the bundled Mooncake hour scaled to two copies, written as request logs
of three instances (`lpc.fleet.request_logs`) over an hour that crosses a UTC midnight, so
each instance has a file per day and many conversations span two files. Ray starts once per
test process (the files that use it run in one worker), locally with two CPUs; where it is not
installed or cannot start, the Ray tests are skipped with the reason (pytest -ra lists it),
never passed silently. Starting Ray takes seconds (about 9 processor-s with its processes), so
the test on Ray runs in the slow step (CI step 1b), as tests/lpc/test_fleet_ray.py does; the
other tests here check the same per-file parse and per-group table through a serial map.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from lpc.access.log_retrain import TraceLogTrainer
from lpc.cli.main import main
from lpc.fleet.fanout import Executor
from lpc.fleet.request_logs import conversation_groups, request_table_apart, write_request_logs
from lpc.fleet.scale import write_scaled_trace
from lpc.replay.ab_options import TRACE_MAX_MODEL_LEN
from lpc.replay.request_table import request_table
from lpc.traces.files import load_lpc_files_apart, load_trace_files
from lpc.traces.jsonl import TraceError
from lpc.traces.load import LoadedTrace, TraceOptions, load_trace
from tests.conftest import RAY_WORKERS as WORKERS
from tests.lpc.traces.helpers import bundled_lines
from training.access_data import access_samples
from training.access_fit import AccessFitConfig

HORIZON_S = 20.0
OPTIONS = TraceOptions(horizon_s=HORIZON_S, max_model_len=TRACE_MAX_MODEL_LEN)
MIDNIGHT_S = 1_767_225_600.0  # 2026-01-01 00:00 UTC
QUICK_FIT = AccessFitConfig(max_epochs=4, patience=2, ensemble=1, teacher_share=0.0, threads=1)


def _serial_map(function, shared, items):
    return [function(shared, item) for item in items]


@pytest.fixture(scope="module")
def sharded_logs(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("fleet-logs")
    source = folder / "head.jsonl"
    source.write_text("\n".join(bundled_lines()[:800]) + "\n")
    scaled = write_scaled_trace(source, 2, folder / "scaled.jsonl.gz")
    trace = load_trace(scaled, OPTIONS)
    span_s = trace.requests[-1].arrival_s
    paths = write_request_logs(trace.requests, folder / "logs", 3, MIDNIGHT_S - 0.7 * span_s)
    return sorted(paths)  # by name: the order `training.log_files` gives for one date each


def _same_trace(a: LoadedTrace, b: LoadedTrace) -> None:
    assert len(a.requests) == len(b.requests)
    for x, y in zip(a.requests, b.requests, strict=True):
        assert (x.request_id, x.arrival_s, x.completion_s) == (
            y.request_id,
            y.arrival_s,
            y.completion_s,
        )
        assert (x.turn.conversation_id, x.turn.turn_index, x.turn.has_next_turn) == (
            y.turn.conversation_id,
            y.turn.turn_index,
            y.turn.has_next_turn,
        )
        assert (x.turn.num_prompt_tokens, x.turn.num_output_tokens) == (
            y.turn.num_prompt_tokens,
            y.turn.num_output_tokens,
        )
        assert x.turn.token_ids.block_ids == y.turn.token_ids.block_ids  # the expanded ids
    assert a.info == b.info
    assert a.trace_block_size == b.trace_block_size


def test_the_logs_shard_conversations_across_files(sharded_logs: list[Path]) -> None:
    days = {p.name[9:19] for p in sharded_logs}
    assert days == {"2025-12-31", "2026-01-01"} and len(sharded_logs) == 6
    trace = load_trace_files(sharded_logs, "lpc", OPTIONS)
    files_of: dict[str, set[str]] = {}
    for request in trace.requests:
        day = "2026-01-01" if request.arrival_s >= MIDNIGHT_S else "2025-12-31"
        files_of.setdefault(request.turn.conversation_id, set()).add(day)
    assert sum(len(days) > 1 for days in files_of.values()) >= 5


def test_files_parsed_apart_give_the_serial_trace(sharded_logs: list[Path]) -> None:
    serial = load_trace_files(sharded_logs, "lpc", OPTIONS)
    _same_trace(load_lpc_files_apart(sharded_logs, OPTIONS, _serial_map), serial)
    one = load_lpc_files_apart(sharded_logs[:1], OPTIONS, _serial_map)
    _same_trace(one, load_trace_files(sharded_logs[:1], "lpc", OPTIONS))
    assert one.path == sharded_logs[0]


def test_the_table_built_per_conversation_group_is_the_whole_table(
    sharded_logs: list[Path],
) -> None:
    requests = load_trace_files(sharded_logs, "lpc", OPTIONS).requests[:400]
    whole = request_table(requests)
    groups = conversation_groups(requests, 5)
    assert len(groups) == 5 and sorted(np.concatenate(groups)) == list(range(len(whole)))
    assert request_table_apart(requests, groups, _serial_map).equals(whole)


def test_a_bad_line_is_named_by_its_file_when_parsed_apart(
    sharded_logs: list[Path], tmp_path: Path
) -> None:
    broken = tmp_path / sharded_logs[1].name
    lines = sharded_logs[1].read_text().splitlines()
    lines[3] = lines[3].replace('"input_length":', '"input_length":-')
    broken.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf"{broken}:4: .*input_length"):
        load_lpc_files_apart([sharded_logs[0], broken], OPTIONS, _serial_map)


@pytest.mark.slow
def test_ray_reads_the_logs_into_the_serial_samples_and_model(
    local_ray, sharded_logs: list[Path]
) -> None:
    """The default suite's check of this code: test_files_parsed_apart_give_the_serial_trace
    and test_the_table_built_per_conversation_group_is_the_whole_table (the files parsed
    apart and the table built per conversation group, through a serial map)."""
    serial_trainer = TraceLogTrainer(horizon_s=HORIZON_S, fit=QUICK_FIT, min_evaluation_requests=50)
    ray_trainer = dataclasses.replace(serial_trainer, executor=Executor("ray", workers=WORKERS))
    serial = serial_trainer.train(sharded_logs, None)
    on_ray = ray_trainer.train(sharded_logs, None)
    assert serial.data.pop("read")["on"] == "serial"
    read = on_ray.data.pop("read")
    assert read["on"] == "ray" and read["file_tasks"] == len(sharded_logs)
    assert read["table_tasks"] > 1 and read["worker_peak_bytes"] and read["task_cpu_s"] > 0
    assert serial.data["split_rule"] == "newest UTC day"  # the files' two days
    assert serial.data == on_ray.data

    a, b = serial.handoff, on_ray.handoff
    assert a is not None and b is not None
    assert b.table.equals(a.table)
    names = list(a.feature_names)
    samples = [access_samples(c.table, names, c.cut_s, HORIZON_S) for c in (a, b)]
    for part in ("fit", "validation", "evaluation"):
        assert np.array_equal(samples[0].features[part], samples[1].features[part])
        assert np.array_equal(samples[0].labels[part], samples[1].labels[part])

    assert serial.metrics == on_ray.metrics
    untimed = [
        dataclasses.replace(c.metadata, metrics={**c.metadata.metrics, "fit_seconds": 0})
        for c in (serial, on_ray)
    ]
    assert untimed[0] == untimed[1]
    for x, y in zip(
        serial.model.state_dict().values(), on_ray.model.state_dict().values(), strict=True
    ):
        assert torch.equal(x, y)
    features = torch.as_tensor(samples[0].features["evaluation"], dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(serial.model(features), on_ray.model(features))


def test_retrain_refuses_ray_flags_it_cannot_use(
    sharded_logs: list[Path], tmp_path: Path, capsys, monkeypatch
) -> None:
    logs = ["retrain", "--logs", str(sharded_logs[0].parent), "--registry", str(tmp_path)]
    assert main([*logs, "--ray-address", "auto"]) == 2
    assert "--ray-address goes with --ray" in capsys.readouterr().err
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "ray" else real_find_spec(name, *a),
    )
    assert main([*logs, "--ray"]) == 2
    assert "--ray needs Ray: pip install 'lpc[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "history.jsonl").exists()  # refused before the job started
