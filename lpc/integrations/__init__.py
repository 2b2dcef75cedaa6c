"""LPC inside real serving engines: a vLLM plugin and an SGLang eviction strategy.

What an engine imports (`vllm_plugin`, `vllm_queue`, `vllm_compat`, `config`, `stats`,
`request_hints`, `predictions`, `metrics`, `sglang_strategy`, `release_plan`, `request_log`,
`plugin_request_log`) needs only the
standard library and `eviction` (plus `predictor.client` when a predictor is configured, and
prometheus_client for the metrics endpoint), and imports its engine only inside `register()`,
so it loads in an engine's own virtual environment. `vllm_driver` and `trace_stream` run in
the project's venv and reach vLLM's through a subprocess.
"""
