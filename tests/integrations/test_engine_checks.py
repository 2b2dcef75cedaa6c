"""Engine configurations the plugin is not verified with are refused when the engine starts.

`engine_checks` finds them (several KV cache groups, speculative decoding); the plugin's
`Scheduler.__init__` wrapper refuses to build such a scheduler, with a message that says what
to do, unless `LPC_ALLOW_UNVERIFIED` names them (then it warns). The last test installs the
wrapper on vLLM's real `Scheduler` (marked `vllm`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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


class StandInScheduler:
    def __init__(self, vllm_config: Any, kv_cache_config: Any, **kwargs: Any) -> None:
        self.built = True


def build(allow: str, monkeypatch: pytest.MonkeyPatch) -> StandInScheduler:
    runtime = make_runtime(allow_unverified=allow)
    monkeypatch.setattr(vllm_plugin, "_REGISTRATION", vllm_plugin._Registration(runtime, []))
    wrapped = type(
        "Scheduler",
        (StandInScheduler,),
        {"__init__": vllm_plugin._wrap_scheduler_init(StandInScheduler.__init__)},
    )
    return wrapped(PLAIN, HYBRID, log_stats=True)


def test_the_scheduler_wrapper_refuses_before_vllm_builds_anything(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(UnverifiedConfigurationError, match="2 KV cache groups"):
        build("", monkeypatch)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        assert build("kv-groups", monkeypatch).built
    assert "runs with 2 KV cache groups" in caplog.text and "not verified" in caplog.text
    assert isinstance(PluginConfig().allow_unverified, str)


REFUSE_IN_VLLM = """
from types import SimpleNamespace
import torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from lpc.integrations import vllm_plugin
from lpc.integrations.config import load_config
from lpc.integrations.engine_checks import UnverifiedConfigurationError

vllm_plugin.install_patch_points(load_config())
full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
window = SlidingWindowSpec(
    block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=64
)
hybrid = KVCacheConfig(
    num_blocks=8,
    kv_cache_tensors=[],
    kv_cache_groups=[KVCacheGroupSpec(["a"], full), KVCacheGroupSpec(["b"], window)],
)
try:
    Scheduler(vllm_config=SimpleNamespace(speculative_config=None), kv_cache_config=hybrid)
except UnverifiedConfigurationError as error:
    print("REFUSED:", error)
vllm_plugin.unregister()
"""


@pytest.mark.vllm
def test_vllm_scheduler_refuses_a_hybrid_kv_cache(vllm_python: Path) -> None:
    out = run_snippet(vllm_python, REFUSE_IN_VLLM, env={"VLLM_PLUGINS": "lpc", "LPC_MODE": "lpc"})
    assert "REFUSED: the LPC eviction plugin is not verified with 2 KV cache groups" in out
