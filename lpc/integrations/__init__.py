"""LPC inside real serving engines: a vLLM plugin and an SGLang eviction strategy.

The engine-facing modules (`vllm_plugin`, `sglang_strategy`) import their engine only inside
`register()`, and everything they build on here uses the standard library and `eviction`,
so this package imports cleanly in an engine's own virtual environment and in ours alike.
"""
