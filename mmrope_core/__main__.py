"""``python -m mmrope_core``: the ``mmrope`` command."""

import sys

from .cli import main

sys.exit(main())
