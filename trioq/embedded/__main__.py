"""`python -m trioq.embedded [--data-dir DIR] [--port P]` is `trioq dev-db`.

A module of its own: the CLI imports `trioq.embedded`, so the package cannot import the CLI
back (that is an import cycle); this entry point sits beside the package and imports both.
"""

import sys

from trioq.cli import main

sys.exit(main(["dev-db", *sys.argv[1:]]))
