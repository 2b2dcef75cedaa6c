"""Every registered policy is selectable by name wherever a policy is selected."""

from __future__ import annotations

import pytest

from eviction import POLICIES, make_evictor
from eviction.registry import ALIASES, CPU_TIER_ONLY
from lpc.benchmarks.evictor_worker import TIMEABLE_POLICIES
from lpc.cli.main import build_parser, main
from lpc.replay.policies import (
    build_evictor,
    evictor_options,
    parse_policies,
    parse_policy,
    policy_help,
)
from tests.lpc.test_ab_cli import chats, run_json  # noqa: F401 (a fixture)


def test_every_registered_policy_has_a_description_and_a_kind() -> None:
    for name, entry in POLICIES.items():
        assert entry.name == name
        assert entry.description and "\n" not in entry.description
        assert entry.kind in ("heuristic", "fitted", "learned", "upper bound")


@pytest.mark.parametrize("name", [n for n, e in POLICIES.items() if e.kind != "learned"])
def test_every_non_learned_policy_parses_under_its_own_name(name: str) -> None:
    spec = parse_policy(name)
    assert (spec.label, spec.evictor, spec.source) == (name, name, None)
    assert spec.is_upper_bound == (POLICIES[name].kind == "upper bound")


def test_the_help_names_every_policy_and_variant() -> None:
    text = policy_help()
    for name in [*POLICIES, *ALIASES, *CPU_TIER_ONLY]:
        assert name in text, name
    ab_help = build_parser()._subparsers._group_actions[0].choices["ab"].format_help()
    assert "s3fifo" in ab_help and "sieve" in ab_help and "arc" in ab_help


def test_unknown_policy_lists_every_choice() -> None:
    with pytest.raises(ValueError, match="unknown policy 'mru'") as error:
        parse_policy("mru")
    for name in ("s3fifo", "sieve", "arc", "lpc-const[=P]", "oracle", "belady"):
        assert name in str(error.value)


def test_the_lpc_variants_keep_their_sources() -> None:
    specs = parse_policies("lpc,lpc-turns,lpc-trace,oracle,lpc-const=0.25")
    assert [(s.evictor, s.source) for s in specs] == [
        ("lpc", "model"),
        ("lpc", "turns"),
        ("lpc", "trace"),
        ("lpc", "oracle"),
        ("lpc", "const"),
    ]
    assert [s.is_upper_bound for s in specs] == [False, False, False, True, False]
    with pytest.raises(ValueError, match=r"unknown policy 'lpc-turns=0\.3'"):
        parse_policy("lpc-turns=0.3")


def test_vllm_arc_is_a_cpu_tier_policy_only() -> None:
    spec = parse_policy("vllm-arc")
    assert (spec.label, spec.evictor, spec.source) == ("vllm-arc", "vllm-arc", None)
    assert spec.cpu_tier_only and not spec.is_upper_bound
    assert not parse_policy("arc").cpu_tier_only
    assert evictor_options(spec, 1e-2, 0.5, None) == {}
    assert [s.label for s in parse_policies("lru,vllm-arc", cpu_tier=True)] == ["lru", "vllm-arc"]
    with pytest.raises(ValueError, match="not a GPU prefix-cache evictor") as error:
        parse_policies("lru,vllm-arc")
    message = str(error.value)
    assert "\n" not in message and "--offload-policies" in message and "use arc" in message
    with pytest.raises(ValueError, match="not a GPU prefix-cache evictor"):
        build_evictor(spec, 8, 1e-2, 0.5, None)
    with pytest.raises(ValueError, match="unknown policy 'mru'") as error:
        parse_policy("mru")
    assert "vllm-arc" in str(error.value)


def test_the_benchmark_can_time_every_deployable_policy() -> None:
    assert set(TIMEABLE_POLICIES) == {n for n, e in POLICIES.items() if e.kind != "upper bound"}
    for name in TIMEABLE_POLICIES:
        make_evictor(name, 4)  # built from the pool size alone


def test_bench_rejects_a_policy_it_cannot_time(capsys) -> None:
    assert main(["bench", "evictor", "--policies", "belady", "--no-progress"]) == 2
    assert "cannot time belady" in capsys.readouterr().err


@pytest.mark.usefixtures("no_plots")  # reads no PNG
def test_ab_runs_the_new_baselines_by_name(chats, tmp_path, capsys) -> None:  # noqa: F811
    result = run_json(
        [
            "ab",
            "--out",
            str(tmp_path / "out"),
            "--dataset",
            str(chats),
            "--duration",
            "300",
            "--max-active",
            "20",
            "--cache-sizes",
            "3000,12000",
            "--policies",
            "lru,s3fifo,sieve,arc",
        ],
        capsys,
    )
    hit = result["comparison"]["hit_ratio"]
    assert set(hit) == {"lru", "s3fifo", "sieve", "arc"}
    for name in ("s3fifo", "sieve", "arc"):
        assert 0.0 < hit[name]["3000"] <= hit[name]["12000"] + 1e-12, name


def test_a_parameterised_name_is_the_alias_it_equals() -> None:
    """`lpc(source=turns)` runs and is labelled exactly as `lpc-turns`: one policy, two
    spellings, the same report."""
    for spelled, alias in (
        ("lpc(source=turns)", "lpc-turns"),
        ("lpc( source = oracle )", "oracle"),
        ("lpc(source=const,p=0.25)", "lpc-const=0.25"),
        ("lpc(p=0.5,source=const)", "lpc-const"),
        ("lpc-return(curve=model)", "lpc-return-model"),
        ("lpc-pooled(source=model)", "lpc-pooled"),
    ):
        assert parse_policy(spelled) == parse_policy(alias), spelled
    assert parse_policy("lpc-return(curve=true-return)").is_upper_bound


def test_a_variant_without_an_alias_is_a_parameter_away() -> None:
    spec = parse_policy("lpc-pooled(source=turns)")
    assert (spec.label, spec.evictor, spec.source) == (
        "lpc-pooled(source=turns)",
        "lpc-pooled",
        "turns",
    )
    assert parse_policy("lpc-pooled(source=oracle)").is_upper_bound
    specs = parse_policies("lru,lpc-pooled(source=const,p=0.3),lpc-turns")
    assert [(s.label, s.evictor, s.constant) for s in specs] == [
        ("lru", "lru", None),
        ("lpc-pooled(source=const,p=0.3)", "lpc-pooled", 0.3),
        ("lpc-turns", "lpc", None),
    ]
    with pytest.raises(ValueError, match="policy listed twice: lpc-turns"):
        parse_policies("lpc-turns,lpc(source=turns)")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("lru(source=model)", "lru takes no parameters"),
        ("lpc(source=access)", "source must be one of model, turns, const, trace, oracle"),
        ("lpc(curve=model)", "lpc has no parameter 'curve'"),
        ("lpc()", "'' is not key=value"),
        ("lpc(source=turns,source=model)", "source given twice"),
        ("lpc-return(source=model)", "lpc-return has no parameter 'source'"),
        ("lpc(source=const)", "p goes with source=const"),
        ("lpc(source=turns,p=0.2)", "p goes with source=const"),
        ("lpc(source=const,p=2)", r"p must be in \[0, 1\]"),
        ("lpc(source=const,p=x)", "'x' is not a number"),
        ("mru(source=model)", "unknown policy"),
        ("lpc(source=turns", "unknown policy"),
    ],
)
def test_a_bad_parameter_is_named(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        parse_policy(name)
    assert "\n" not in str(error.value) and repr(name) in str(error.value)


def test_every_cpu_tier_only_policy_has_its_engine_class() -> None:
    from lpc.replay.cache_policy_tier import VLLM_POLICIES

    assert set(VLLM_POLICIES) == set(CPU_TIER_ONLY)
