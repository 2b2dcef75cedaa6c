"""Differential testing of the block manager against vLLM's own prefix cache.

`ops` is the operation and step-record format both sides speak, `streams` generates seeded
request streams, and `replay` runs a stream on our manager. `ops` and `streams` use only the
standard library, so the replay driver inside vLLM's venv (`scripts/vllm_replay.py`) can
import them; importing this package imports nothing else.
"""
