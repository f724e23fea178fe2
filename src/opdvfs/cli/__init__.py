"""The ``opdvfs`` command line: a thin typer layer over the library (DESIGN §6).

Every command reports bad input as one line on stderr and exit status 2, never a traceback, and
never leaves a half-written output file (outputs are written to a temp file, then renamed).
``--json`` prints exactly one JSON object on stdout. One module per pipeline stage; importing
them (:mod:`opdvfs.cli._commands`) registers their commands on :data:`app`, in the order
``opdvfs --help`` lists them. This package face loads them on first use of :data:`app` (PEP 562),
so ``opdvfs --version`` imports neither typer nor the commands.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from opdvfs._lazy import attach

__all__ = ["UsageError", "app", "main", "parse_clocks"]

#: Exported name -> the module that defines it (every command registered).
_EXPORTS = {
    name: "opdvfs.cli._commands" for name in ("UsageError", "app", "parse_clocks", "stderr")
}

if TYPE_CHECKING:
    from opdvfs.cli._app import UsageError, app, parse_clocks


def main() -> None:
    """Console-script entry point."""
    if sys.argv[1:] == ["--version"]:
        # nothing to parse: typer, rich, pydantic and numpy (~0.3 s) would only print this line
        from opdvfs import __version__

        sys.stdout.write(f"opdvfs {__version__}\n")
        return
    from opdvfs.cli._commands import app, stderr

    try:
        app()
    except KeyboardInterrupt:
        stderr.print("opdvfs: interrupted")
        sys.exit(130)


__getattr__, __dir__ = attach(__name__, _EXPORTS)
