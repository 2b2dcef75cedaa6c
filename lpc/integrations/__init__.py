"""LPC inside real serving engines: a vLLM plugin and an SGLang eviction strategy.

Everything here runs inside an engine (`vllm_plugin`, `vllm_queue`, `vllm_compat`, `config`,
`stats`, `request_hints`, `predictions`, `metrics`, `access_runtime`, `conversation_table`,
`sglang_strategy`, `request_log`, `plugin_request_log`, `cpu_tier_policy`,
`vllm_cache_policy`, `finished_releases`) and needs only
the standard library, `eviction` and `predictor`'s light modules (plus `predictor.client` when
a predictor is configured, and prometheus_client for the metrics endpoint); it imports its
engine only inside `register()` (`vllm_cache_policy`, vLLM's classes, is imported by vLLM), so
it loads in an engine's own virtual environment from the core install (`pip install lpc`, no
extras). It imports no other package of `lpc`. The drivers that run engines with it for tests
and scripts are in `lpc.drivers`.
"""
