"""`python -m lpc.cli`: the same command line as the `lpc` script."""

import sys

from lpc.cli.main import main

sys.exit(main())
