"""Schedules that earlier tuning runs measured, kept per job (``opdvfs tune``'s cache, #21).

A job is its operator sequence (one iteration's operators as the executor counts them) with what
a plan is valid for: the device, the target, the objective. :func:`cache_key` hashes them;
:class:`TuneCache` keeps one JSON file per key (the schedule and what it measured), so the next
run of the same job applies at once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opdvfs._files import write_text_atomic
from opdvfs.runtime.actuators.left_set import CACHE_ENV, default_cache_dir
from opdvfs.schedule import PipelineSchedule, Schedule

__all__ = ["CACHE_ENV", "TuneCache", "cache_key", "default_cache_dir"]


def cache_key(op_names: Sequence[str], *, device: str, target: float, **extra: Any) -> str:
    """Return the cache key of a job: a SHA-256 of its operator sequence and what the plan fits.

    The sequence is one iteration's operators as the executor counts them (the last warm-up
    iteration's); the device (with a simulated GPU's work scale), the target and ``extra``
    (the objective; a pipeline job's ``stages``: every rank's sequence key, so a changed stage
    is another job) are part of the key, since a plan is only valid for them.
    """
    doc = {"ops": list(op_names), "device": device, "target": round(float(target), 9), **extra}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class TuneCache:
    """Schedules measured by earlier tuning runs, one JSON file per :func:`cache_key`."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        # absolute now: a script's os.chdir (as Hydra does) must not move it
        self.folder = Path(folder).absolute() if folder is not None else default_cache_dir()

    def path(self, key: str) -> Path:
        """Return the file of ``key``."""
        return self.folder / f"{key}.json"

    def get(self, key: str) -> tuple[Schedule | PipelineSchedule, dict[str, Any]] | None:
        """Return the cached schedule and what it measured, or None (none, or unreadable).

        A pipeline job's is its whole :class:`~opdvfs.schedule.PipelineSchedule` (every
        stage's, each rank applies its own).
        """
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            doc = json.loads(path.read_text())
            kind = PipelineSchedule if doc.get("pipeline") else Schedule
            return kind.model_validate(doc["schedule"]), dict(doc.get("measured", {}))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(
        self, key: str, schedule: Schedule | PipelineSchedule, measured: dict[str, Any]
    ) -> Path:
        """Write the schedule under ``key`` (atomically); return its file."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        doc: dict[str, Any] = {"schedule": schedule.model_dump(mode="json"), "measured": measured}
        if isinstance(schedule, PipelineSchedule):
            doc["pipeline"] = True
        write_text_atomic(path, json.dumps(doc))
        return path
