"""Drivers that run real engines with LPC inside them, for tests, scripts and benchmarks.

Nothing here ships into an engine: `vllm_driver` drives vLLM's `KVCacheManager` with the
plugin in vLLM's own venv (through a subprocess), `sglang_radix` drives SGLang's radix caches,
`release_plan` and `trace_stream` turn a workload into the operations those drivers replay.
What runs inside the engine lives in `lpc.integrations`.
"""
