"""LPC: learned prefix-cache eviction — the host side (block manager, simulator, A/B, CLI).

This package is the composition root: it wires `eviction`, `predictor` and `training`
together. Importing it stays light; heavy dependencies load inside the commands that need them.
"""

__version__ = "0.1.0"
