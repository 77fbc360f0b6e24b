"""``python -m gputally.cli``: the ``gputally`` command."""

import sys

from .main import main

sys.exit(main())
