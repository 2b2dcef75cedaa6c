"""The A/B replay engine: workloads through the block manager, one policy and size at a time.

`ab_run.run_ab` is the entry point: `ab_options` holds what it is asked, `ab_plan` loads and
splits the workload, `ab_sources` fits the sources, `ab_run` replays and `ab_report` writes.
`simulator` replays one policy at one cache size, `policies` names the policies and their
probability sources, `ab` compares them, `report` writes tables, CSV and plots. Builds on
`lpc.blocks`, `lpc.traces` and `lpc.chat`.
"""
