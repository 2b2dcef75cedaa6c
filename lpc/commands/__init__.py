"""Command modules of the `lpc` CLI, in the order `lpc --help` lists them."""

from lpc.commands import ab, bench

COMMAND_MODULES = (ab, bench)
