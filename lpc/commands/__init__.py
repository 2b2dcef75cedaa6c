"""Command modules of the `lpc` CLI, in the order `lpc --help` lists them."""

from lpc.commands import bench, models, serve

COMMAND_MODULES = (bench, serve, models)
