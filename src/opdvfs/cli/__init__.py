"""The ``opdvfs`` command line: a thin typer layer over the library (DESIGN §6).

Every command reports bad input as one line on stderr and exit status 2, never a traceback, and
never leaves a half-written output file (outputs are written to a temp file, then renamed).
``--json`` prints exactly one JSON object on stdout. One module per pipeline stage; importing
them (:mod:`opdvfs.cli._commands`) registers their commands on :data:`app`, in the order
``opdvfs --help`` lists them. This package face loads them on first use of :data:`app` (PEP 562),
so ``opdvfs --version`` imports neither typer nor the commands.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opdvfs._lazy import attach

__all__ = ["UsageError", "app", "main", "parse_clocks", "strip_launcher_local_rank"]

#: Exported name -> the module that defines it (every command registered).
_EXPORTS = {
    name: "opdvfs.cli._commands" for name in ("UsageError", "app", "parse_clocks", "stderr")
}

if TYPE_CHECKING:
    from opdvfs.cli._app import UsageError, app, parse_clocks


#: The local rank a launcher passes as the module's first argument: deepspeed's
#: ``--local_rank=N`` (unless ``--no_local_rank``), ``torch.distributed.launch``'s
#: ``--local-rank=N``.
_LOCAL_RANK_ARG = re.compile(r"--local[_-]rank(?:=(\d+))?")


def strip_launcher_local_rank(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """Return ``argv`` without a launcher's leading ``--local_rank=N`` (or ``N`` apart), and N.

    ``deepspeed --module opdvfs tune ...`` starts ``python -m opdvfs --local_rank=0 tune ...``
    in every process (it also sets ``LOCAL_RANK``); only a leading one, before the command, is a
    launcher's: a script's own ``--local_rank`` after ``--`` is left where it is.
    """
    args = list(argv)
    if len(args) < 2 or not (match := _LOCAL_RANK_ARG.fullmatch(args[1])):
        return args, None
    if match.group(1) is not None:
        return [args[0], *args[2:]], match.group(1)
    if len(args) > 2 and args[2].isdigit():
        return [args[0], *args[3:]], args[2]
    return args, None


#: Where the kernel picks the transparent hugepages' defragmentation mode (Linux).
_THP_DEFRAG = "/sys/kernel/mm/transparent_hugepage/defrag"

#: Commands that work on whole tables in this process and start no other program.
_TABLE_COMMANDS = frozenset(
    ("import", "info", "evaluate", "report", "fit", "plan", "profile", "simulate")
)


def _small_pages_for_numpy(argv: Sequence[str]) -> None:
    """Have numpy not ask for transparent hugepages where each fault would compact memory.

    numpy advises hugepages for every array of 4 MB or more; where the kernel's defrag mode is
    ``madvise`` (or ``always``) each first touch of such an array then waits for the kernel to
    assemble a 2 MB page. A command at a million ops allocates gigabytes of short-lived arrays:
    ``opdvfs plan`` spent 1.1-2.3 s of system time on the faults, about 1 s more than with 4 KB
    pages, for the same user time and peak memory. Only for :data:`_TABLE_COMMANDS` (numpy
    reads ``NUMPY_MADVISE_HUGEPAGE`` when it is imported; they start no program that would
    inherit it), and never over a value the user set.
    """
    command = next((a for a in argv[1:] if not a.startswith("-")), None)
    if command not in _TABLE_COMMANDS or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    try:
        with open(_THP_DEFRAG) as f:
            mode = f.read()
    except OSError:  # not Linux, or no transparent hugepages
        return
    if "[madvise]" in mode or "[always]" in mode:
        os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"


def main() -> None:
    """Console-script entry point."""
    sys.argv, local_rank = strip_launcher_local_rank(sys.argv)
    if local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", local_rank)
    if sys.argv[1:] == ["--version"]:
        # nothing to parse: typer, rich, pydantic and numpy (~0.3 s) would only print this line
        from opdvfs import __version__

        sys.stdout.write(f"opdvfs {__version__}\n")
        return
    _small_pages_for_numpy(sys.argv)
    from opdvfs.cli._commands import app, stderr

    try:
        app()
    except KeyboardInterrupt:
        stderr.print("opdvfs: interrupted")
        sys.exit(130)


__getattr__, __dir__ = attach(__name__, _EXPORTS)
