"""The `lpc` command line: `main.py` builds the parser from one module per verb.

Each command module exposes `register(subparsers)`, which adds its parser and sets `run`;
heavy imports happen inside `run`, so `lpc --help` stays instant. This package sits on top of
the house: it may import every other package, and nothing imports it.
"""
