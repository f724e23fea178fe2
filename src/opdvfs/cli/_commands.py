"""Every command of the command line, registered on :data:`~opdvfs.cli._app.app`.

Imported once, in this order, which is the order ``opdvfs --help`` lists the commands.
"""

from __future__ import annotations

# importing a command module registers its commands
import opdvfs.cli.data
import opdvfs.cli.doctor
import opdvfs.cli.evaluate
import opdvfs.cli.models
import opdvfs.cli.plan
import opdvfs.cli.runtime
import opdvfs.cli.sim
import opdvfs.cli.tune  # noqa: F401
from opdvfs.cli._app import UsageError, app, parse_clocks, stderr

__all__ = ["UsageError", "app", "parse_clocks", "stderr"]
