"""Engine configurations the plugin is not verified with are refused when the engine starts.

`engine_checks` finds them (several KV cache groups, speculative decoding); the LPC scheduler
class refuses to build such a scheduler, before vLLM's constructor, with a message that says
what to do, unless `LPC_ALLOW_UNVERIFIED` names them (then it warns); a hybrid model's KV cache
it leaves stock before that. The last test runs the class's check on real vLLM (marked
`vllm`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from lpc.integrations import vllm_plugin
from lpc.integrations.config import PluginConfig, PluginConfigError, load_config
from lpc.integrations.engine_checks import (
    UnverifiedConfigurationError,
    check_engine,
    parse_allowed,
    unverified_configurations,
)
from tests.integrations.snippets import run_snippet
from tests.integrations.test_fail_safe import make_runtime

ONE_GROUP = SimpleNamespace(kv_cache_groups=["full"])
HYBRID = SimpleNamespace(kv_cache_groups=["full", "sliding-window"])
PLAIN = SimpleNamespace(speculative_config=None)
SPECULATIVE = SimpleNamespace(speculative_config=SimpleNamespace(method="eagle"))


def test_a_verified_engine_has_nothing_to_report() -> None:
    assert unverified_configurations(PLAIN, ONE_GROUP) == []
    assert check_engine(PLAIN, ONE_GROUP, ()) == []


def test_unverified_engines_are_refused_with_what_to_do() -> None:
    with pytest.raises(UnverifiedConfigurationError) as refused:
        check_engine(SPECULATIVE, HYBRID, ())
    message = str(refused.value)
    assert "2 KV cache groups" in message and "speculative decoding (eagle)" in message
    assert "LPC_ALLOW_UNVERIFIED=kv-groups,speculative-decoding" in message
    assert "vLLM's own scheduler class" in message
    with pytest.raises(UnverifiedConfigurationError, match="speculative decoding"):
        check_engine(SPECULATIVE, HYBRID, ("kv-groups",))
    allowed = check_engine(SPECULATIVE, HYBRID, ("kv-groups", "speculative-decoding"))
    assert [item.name for item in allowed] == ["kv-groups", "speculative-decoding"]


def test_the_allow_list_is_validated() -> None:
    config = load_config({"LPC_ALLOW_UNVERIFIED": " kv-groups , speculative-decoding"})
    assert parse_allowed(config.allow_unverified) == ("kv-groups", "speculative-decoding")
    with pytest.raises(PluginConfigError, match=r"LPC_ALLOW_UNVERIFIED.*'pipeline'"):
        load_config({"LPC_ALLOW_UNVERIFIED": "kv-groups,pipeline"})


def test_the_scheduler_class_check_refuses_unless_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the LPC scheduler class runs before vLLM's constructor builds anything
    (`vllm_plugin.check_engine`): a refusal, or with the configuration allowed, a warning."""
    with pytest.raises(UnverifiedConfigurationError, match="2 KV cache groups"):
        vllm_plugin.check_engine(make_runtime(allow_unverified="").config, PLAIN, HYBRID)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        config = make_runtime(allow_unverified="kv-groups").config
        vllm_plugin.check_engine(config, PLAIN, HYBRID)
    assert "runs with 2 KV cache groups" in caplog.text and "not verified" in caplog.text
    assert isinstance(PluginConfig().allow_unverified, str)


REFUSE_IN_VLLM = """
from types import SimpleNamespace
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from lpc.integrations import vllm_plugin
from lpc.integrations.engine_checks import UnverifiedConfigurationError
from lpc.integrations.vllm_scheduler_class import LPCScheduler, prepare

full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
window = SlidingWindowSpec(
    block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=64
)

def kv(*specs):
    groups = [KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)

def engine(speculative):
    return SimpleNamespace(
        speculative_config=speculative, additional_config={"lpc": {}},
        cache_config=SimpleNamespace(enable_prefix_caching=True),
    )

print("HYBRID", prepare(LPCScheduler, engine(None), kv(full, window)))
try:
    prepare(LPCScheduler, engine(SimpleNamespace(method="eagle")), kv(full))
except UnverifiedConfigurationError as error:
    print("REFUSED:", error)
print("REGISTERED", vllm_plugin.is_registered())
"""


@pytest.mark.vllm
def test_the_vllm_scheduler_class_refuses_speculative_decoding(vllm_python: Path) -> None:
    """On real vLLM, before vLLM's constructor: a hybrid model's KV cache stays stock (the
    class orders one full-attention group), speculative decoding is refused, and nothing is
    registered."""
    out = run_snippet(vllm_python, REFUSE_IN_VLLM, env={"VLLM_PLUGINS": ""})
    assert "HYBRID None" in out, out
    assert "REFUSED: the LPC eviction plugin is not verified with speculative decoding" in out
    assert "REGISTERED False" in out, out
