"""The `trioq` command line: `commands` builds the parser and runs a command; `worker` starts
and stops a worker process; `admin` holds the inspect-and-redrive commands; `ops` renders
`status` and `explain`; `errors` turns any failure into one line and an exit code."""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
