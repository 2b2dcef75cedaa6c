"""LPC inside real serving engines: a vLLM plugin and an SGLang eviction strategy.

Everything here runs inside an engine and needs only the standard library, `eviction`,
`predictor`'s light modules (plus `predictor.client` when a predictor is configured, and
prometheus_client for the metrics endpoint) and `lpc.blocks` (the shadow caches); it imports
its engine only inside `register()` (`vllm_cache_policy`, vLLM's classes, is imported by
vLLM), so it loads in an engine's own virtual environment from the core install (`pip install
lpc`, no extras). It imports no other package of `lpc`; the drivers that run engines with it
for tests and scripts are in `lpc.drivers`. Why: docs/design.md, "Packages and layers".
"""
