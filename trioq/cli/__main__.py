"""`python -m trioq.cli ...`: the same as the `trioq` script."""

import sys

from .commands import main

sys.exit(main())
