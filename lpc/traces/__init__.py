"""Production request traces: importers (Mooncake, Alibaba Bailian), prefix linkage and the
expansion of block hash ids into the token sequences the block manager replays.

`lpc.traces.load.load_trace` is the entry point; `lpc.traces.lpc_trace` is the project's own
format.
"""
