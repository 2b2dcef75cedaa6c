"""`lpc ab --offload-sizes`: the two-tier figures in every report, single-tier figures
unchanged, and bad two-tier flags refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.cli.main import main
from tests.lpc.plots import LINE_PLOTS, skip_plots
from tests.lpc.test_ab_cli import chats, run_json  # noqa: F401 (chats is a fixture)

COMMON = ["--duration", "300", "--max-active", "30", "--cache-sizes", "3000,6000"]


def test_offload_sizes_add_two_tier_figures_and_change_nothing_else(
    chats: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
    monkeypatch,
) -> None:
    # Only the two-tier plot is read here (the others: tests/lpc/test_ab_cli.py)
    skip_plots(monkeypatch, LINE_PLOTS)
    base = ["ab", "--dataset", str(chats), *COMMON, "--policies", "lru,lpc-turns"]
    single = run_json([*base, "--out", str(tmp_path / "one")], capsys)
    two = run_json(
        [
            *base,
            "--out",
            str(tmp_path / "two"),
            "--offload-sizes",
            "12K,24K",
            "--offload-policies",
            "lru,arc",
            "--host-to-device-gbps",
            "50",
            "--ttft-prefill-ns-per-token-pair",
            "0",
        ],
        capsys,
    )
    assert "two_tier" not in single
    for a, b in zip(single["results"], two["results"], strict=True):
        assert {k: v for k, v in a.items() if k != "seconds"} == {
            k: v for k, v in b.items() if k != "seconds"
        }
    assert single["comparison"] == two["comparison"]
    rows = two["two_tier"]["results"]
    assert len(rows) == 2 * 2 * 2 * 2  # GPU policies × CPU policies × GPU sizes × CPU sizes
    device = {(r["policy"], r["cache_tokens"]): r["token_hit_ratio"] for r in single["results"]}
    for row in rows:
        assert row["device_hit_ratio"] == pytest.approx(
            device[(row["policy"], row["cache_tokens"])]
        )
        assert row["hit_ratio"] >= row["device_hit_ratio"]
        for key in ("host_hit_ratio", "ttft_p50_s", "ttft_p90_s", "prefill_gpu_s_saved"):
            assert key in row
    latency = two["two_tier"]["settings"]["latency"]
    assert latency["host_to_device_bytes_per_s"] == 50e9
    assert latency["prefill_s_per_token_pair"] == 0.0
    assert "overridden" in latency["model"]
    out = tmp_path / "two"
    assert (out / "two_tier.csv").read_text().count("\n") == len(rows) + 1
    assert (out / "two_tier_hit_ratio.png").stat().st_size > 0
    assert "## Two tiers" in (out / "report.md").read_text()
    assert not (tmp_path / "one" / "two_tier.csv").exists()


@pytest.mark.usefixtures("no_plots")
def test_a_cpu_policy_gets_its_probability_source(
    chats: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
) -> None:
    """lpc-turns only in the CPU tier: its source is fitted although no GPU policy reads it."""
    result = run_json(
        [
            "ab",
            "--dataset",
            str(chats),
            *COMMON,
            "--policies",
            "lru",
            "--offload-sizes",
            "12K",
            "--offload-policies",
            "lpc-turns",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert [r["offload_policy"] for r in result["two_tier"]["results"]] == ["lpc-turns"] * 2


@pytest.mark.usefixtures("no_plots")
def test_vllm_arc_runs_in_the_cpu_tier_only(
    chats: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
) -> None:
    """`--offload-policies vllm-arc`: vLLM's own ARC in the CPU tier; as a GPU policy it is
    refused in one line that says why and what to use."""
    base = ["ab", "--dataset", str(chats), *COMMON, "--offload-sizes", "12K"]
    result = run_json(
        [*base, "--policies", "lru", "--offload-policies", "vllm-arc,arc", "--out", str(tmp_path)],
        capsys,
    )
    rows = {(r["offload_policy"], r["cache_tokens"]): r for r in result["two_tier"]["results"]}
    assert sorted(rows) == [("arc", 3000), ("arc", 6000), ("vllm-arc", 3000), ("vllm-arc", 6000)]
    assert all(rows[("vllm-arc", size)]["host_hit_tokens"] > 0 for size in (3000, 6000))
    code = main([*base, "--policies", "vllm-arc", "--out", str(tmp_path), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "--policies: vllm-arc is vLLM's CPU offload tier policy" in err
    assert "give it to --offload-policies; for the GPU tier use arc" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offload-sizes", "12K", "--offload-policies", "lru,mru"], "--offload-policies"),
        (["--offload-sizes", "12K", "--closed-loop", "--policies", "lru"], "--closed-loop"),
    ],
)
def test_bad_two_tier_flags_give_one_clear_line(
    chats: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
    args,
    message,
) -> None:
    code = main(["ab", "--dataset", str(chats), "--out", str(tmp_path), "--no-progress", *args])
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offload-sizes", "0"], "cache sizes must be > 0"),
        (["--host-to-device-gbps", "0"], "must be a finite number > 0"),
        (["--ttft-overhead-s", "-1"], "must be a finite number >= 0"),
        (["--ttft-prefill-ns-per-token-pair", "-0.1"], "must be a finite number >= 0"),
        (["--offload-store-threshold", "x"], "is not an integer"),
    ],
)
def test_bad_two_tier_values_are_rejected_by_the_parser(capsys, args, message) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["ab", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_default_flags_give_the_named_models_latency() -> None:
    from lpc.cli.ab_tiers import tier_settings_from
    from lpc.cli.main import build_parser
    from lpc.replay.latency import TierLatency

    args = build_parser().parse_args(["ab", "--offload-sizes", "8M"])
    assert tier_settings_from(args).latency == TierLatency()
    args = build_parser().parse_args(
        ["ab", "--offload-sizes", "8M", "--ttft-prefill-ns-per-token-pair", "1.5"]
    )
    latency = tier_settings_from(args).latency
    assert latency.prefill_s_per_token_pair == pytest.approx(1.5e-9)
    assert "overridden" in latency.model
