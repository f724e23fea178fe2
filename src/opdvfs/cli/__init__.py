"""The ``opdvfs`` command line: a thin typer layer over the library (DESIGN §6).

Every command reports bad input as one line on stderr and exit status 2, never a traceback, and
never leaves a half-written output file (outputs are written to a temp file, then renamed).
``--json`` prints exactly one JSON object on stdout. One module per pipeline stage; importing
them registers their commands on :data:`app`, in the order ``opdvfs --help`` lists them.
"""

from __future__ import annotations

import sys

from opdvfs.cli import (  # noqa: F401 - registers the commands
    data,
    evaluate,
    models,
    plan,
    runtime,
    sim,
)
from opdvfs.cli._app import UsageError, app, parse_clocks, stderr

__all__ = ["UsageError", "app", "main", "parse_clocks"]


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        stderr.print("opdvfs: interrupted")
        sys.exit(130)
