"""Command modules of the `lpc` CLI, in the order `lpc --help` lists them."""

from lpc.commands import ab, bench, models, retrain, serve, train

COMMAND_MODULES = (ab, train, retrain, serve, models, bench)
