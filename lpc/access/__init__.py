"""The access-feature model's wiring into the replay and the training jobs.

`table` builds the access-feature table of a workload (what an engine knows at each release),
`source` turns an access model into the replay's probability source, `training` fits a model
from a trace (`lpc train --trace`) and `lpc.access.log_retrain` is the daily job's branch for
trace files and request logs. Builds on the replay engine and the trace readers.
"""
