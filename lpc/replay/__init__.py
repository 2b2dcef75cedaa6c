"""The A/B replay engine: workloads through the block manager, one policy and size at a time.

`ab_pipeline.run_ab` is the entry point (load → build workload → fit sources → replay grid →
compare → report); `simulator` replays one policy at one cache size, `policies` names the
policies and their probability sources, `ab` compares them, `report` writes tables, CSV and
plots. Builds on `lpc.blocks`, `lpc.traces` and `lpc.chat`.
"""
