"""`lpc vllm-ab`: the plugin's LPC_* settings for a policy become the `lpc` table of vLLM's
`--additional-config`, where the scheduler class carries LPC, typed and checked as the plugin
reads them, and nothing of LPC is left in the engine's environment. The runs themselves:
tests/integrations/test_vllm_ab_through.py (marked `vllm`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.drivers.release_plan import PluginSettings
from lpc.drivers.vllm_scheduler import (
    EngineSettings,
    RequestsFile,
    additional_config_table,
    parse_policies,
    policy_environment,
    run_policy,
    scheduler_class_environment,
)
from lpc.integrations.config import load_config
from lpc.integrations.engine_config import config_from_table


@pytest.mark.parametrize("label", ["lpc-const=0.3", "lpc-pooled", "lpc", "shadow-pooled"])
def test_a_policys_table_configures_the_plugin_as_its_environment_does(label: str) -> None:
    (policy,) = parse_policies(label)
    settings = PluginSettings(scale_per_s=0.02, conversation_table_max_tokens=1000)
    variables, _ = policy_environment(policy, settings)
    rest, additional = scheduler_class_environment(variables)
    table = additional["lpc"]
    assert config_from_table(table) == load_config(variables)
    assert len(table) == sum(name.startswith("LPC_") for name in variables)
    assert rest == {"VLLM_PLUGINS": "lpc"}


def test_the_table_holds_typed_values_one_per_variable() -> None:
    (policy,) = parse_policies("lpc-pooled")
    variables, send = policy_environment(policy, PluginSettings())
    assert send  # no access model: the trace's p ride in the requests as trusted hints
    assert additional_config_table(variables) == {
        "evictor": "lpc-pooled",
        "scale_per_s": 0.01,
        "fallback_probability": 0.5,
        "stats_log_interval_s": 0.0,
        "trust_request_hints": True,
    }


def test_interleaving_through_the_seam_is_refused_before_any_engine_starts(
    tmp_path: Path,
) -> None:
    """Interleaving builds stock vLLM's scheduler beside the LPC scheduler class in one
    process: a vLLM whose pools take LPC through the seam cannot hold both."""
    (policy,) = parse_policies("lpc-pooled")
    requests = RequestsFile(tmp_path / "requests.jsonl", 1, 10, 1, 11, 0)
    with pytest.raises(ValueError, match="interleaving pairs a plugin policy"):
        run_policy(
            tmp_path / "python",
            requests,
            policy,
            EngineSettings(kv_tokens=160),
            PluginSettings(),
            tmp_path,
            eviction_policy="lpc",
            interleave=True,
        )
