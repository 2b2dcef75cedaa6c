"""The fit of measured prefill and copy timings, and the GPU measurement script's CPU paths."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from lpc.errors import InvalidInputError
from lpc.replay.latency import TierLatency
from lpc.replay.latency_calibration import copy_bandwidth, fit_prefill

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "measure_tier_latency.py"


def _script():
    spec = importlib.util.spec_from_file_location("measure_tier_latency", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fit_recovers_a_quadratic_prefill_and_prices_suffixes_as_differences() -> None:
    lengths = [1024, 2048, 4096, 8192, 16384, 32768]
    truth = [0.006 + 3e-5 * n + 5e-10 * n**2 for n in lengths]
    fit = fit_prefill(lengths, truth)
    assert fit.intercept_s == pytest.approx(0.006, rel=1e-6)
    assert fit.s_per_token == pytest.approx(3e-5, rel=1e-6)
    assert fit.s_per_token_pair == pytest.approx(5e-10, rel=1e-6)
    assert fit.max_relative_error < 1e-6
    k, n = 16384, 2048
    assert fit.suffix_seconds(k, n) == pytest.approx(fit.seconds(k + n) - fit.seconds(k))
    # The latency model with the fit's figures prices the same suffix the same way.
    latency = TierLatency(
        prefill_tokens_per_s=1 / fit.s_per_token, prefill_s_per_token_pair=fit.s_per_token_pair
    )
    got = latency.suffix_prefill_s(np.array([float(k)]), np.array([float(n)]))[0]
    assert got == pytest.approx(fit.suffix_seconds(k, n))


def test_the_fit_keeps_its_coefficients_non_negative() -> None:
    # Times that fall with length would need a negative slope: the fit clamps it at 0.
    fit = fit_prefill([100, 200, 400, 800], [0.04, 0.038, 0.037, 0.036])
    assert fit.s_per_token >= 0 and fit.s_per_token_pair >= 0 and fit.intercept_s >= 0
    assert fit.max_relative_error > 0


@pytest.mark.parametrize(
    ("lengths", "seconds", "message"),
    [
        ([1, 2], [0.1, 0.2], "at least 3 distinct lengths"),
        ([1, 1, 1, 2], [0.1, 0.1, 0.1, 0.2], "at least 3 distinct lengths"),
        ([1, 2, 3], [0.1, 0.2], "one time per length"),
        ([1, 2, 3], [0.1, 0.0, 0.3], "finite and > 0"),
        ([1, 2, 3], [0.1, float("nan"), 0.3], "finite and > 0"),
    ],
)
def test_bad_measurements_are_refused(lengths, seconds, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        fit_prefill(lengths, seconds)


def test_copy_bandwidth_is_the_best_timing() -> None:
    assert copy_bandwidth(3_000, [0.003, 0.001, 0.002]) == pytest.approx(3e6)
    with pytest.raises(InvalidInputError, match="positive size and times"):
        copy_bandwidth(3_000, [])
    with pytest.raises(InvalidInputError, match="positive size and times"):
        copy_bandwidth(0, [0.1])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lengths", "512,x"], "--lengths: expected comma-separated integers"),
        (["--lengths", "0,512"], "--lengths: expected positive integers"),
        (["--suffixes", "4096"], "--suffixes: expected CACHED:NEW pairs"),
        (["--suffixes", "4096:0"], "--suffixes: both counts must be positive"),
    ],
)
def test_the_script_refuses_bad_lists_in_one_line(argv, message) -> None:
    with pytest.raises(SystemExit, match=message):
        _script().parse_args(argv)


def test_the_script_refuses_a_hit_of_partial_blocks(capsys) -> None:
    with pytest.raises(SystemExit):
        _script().parse_args(["--hit-tokens", "100", "--block-tokens", "16"])
    assert "multiple of --block-tokens" in capsys.readouterr().err


# transformers' deprecation of `past_key_values` is the script's to follow; in a subprocess its
# warning went to the captured stderr, unread, as it goes to the filter here.
@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_the_script_measures_a_tiny_model_on_the_cpu(tmp_path: Path, monkeypatch, capsys) -> None:
    """The prefill stage end to end on a two-layer model; the copy stage says it needs CUDA.

    The script's `main` runs in this process (a fresh interpreter would pay torch's and
    transformers' imports again); its seeding of torch's global generator stays inside
    `fork_rng`, so no later test sees it."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "latency.json"
    argv = ["--model", "tiny", "--device", "cpu", "--lengths", "32,64,128"]
    argv += ["--suffixes", "64:32", "--repeats", "1", "--out", str(out)]
    with torch.random.fork_rng(devices=[]):
        assert _script().main(argv) == 0
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert [row["tokens"] for row in report["prefill"]["lengths"]] == [32, 64, 128]
    assert all(row["seconds"] > 0 for row in report["prefill"]["lengths"])
    assert set(report["prefill"]["fit"]) >= {"s_per_token", "s_per_token_pair", "intercept_s"}
    (suffix,) = report["prefill"]["suffixes"]
    assert suffix["seconds"] > 0 and "error" not in suffix
    # The bottom-right causal attention computes what transformers' own sdpa does.
    assert suffix["lower_right_seconds"] > 0
    assert suffix["lower_right_logits_max_abs_diff"] < 1e-2
    assert "CUDA" in report["copy"]["skipped"]
    assert report["assumed"] == TierLatency().to_dict()
    assert "tiny on cpu" in stdout
