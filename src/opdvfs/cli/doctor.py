"""The doctor command: what this machine offers opdvfs (driver, NVML, GPUs, root, zeusd, torch).

``opdvfs doctor [--json]`` prints one line per check (:func:`opdvfs.runtime.doctor.diagnose`),
read-only: it sets no clock. It exits 0 whatever it finds (a machine without a GPU still runs
every command on a simulated one), 1 when a check failed (something present but broken).
"""

from __future__ import annotations

import json

import typer

from opdvfs.cli._app import JsonOption, app, reports_errors, stdout

#: How each status shows on a terminal.
_MARKS = {"ok": "ok    ", "warn": "warn  ", "absent": "absent", "fail": "FAIL  "}


@app.command()
@reports_errors
def doctor(as_json: JsonOption = False) -> None:
    """Check what this machine offers: driver, NVML, GPUs and clocks, root, zeusd, torch.

    Read-only: no clock is set or reset. Exits 1 when a check failed (present but broken).
    """
    from opdvfs.runtime.doctor import diagnose

    checks = diagnose()
    if as_json:
        print(json.dumps({"checks": [c.to_dict() for c in checks]}))
    else:
        for check in checks:
            stdout.print(
                f"{_MARKS[check.status]} {check.name:<11} {check.message}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)
