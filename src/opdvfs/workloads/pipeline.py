"""Whole pipeline-parallel jobs: every stage's workload of one pipeline, for the twin.

The transformer builders (:func:`~opdvfs.workloads.transformer.transformer_training`) model one
device of a pipeline: its 1F1B passes, each opened by the ``Recv`` of its input and closed by the
``Send`` of its output, with the pipeline bubble folded into the ``Recv``'s ``wait_us`` (sized
from nominal peer rates). A whole pipeline instead gives one workload per stage with no waits:
the waits are what running the stages together produces (:mod:`opdvfs.experiments.pipeline`
composes the stages' runs on the job's dependency graph, :mod:`opdvfs.plan.ranks`).

A pipeline is named like a workload (``gpt3-pp8``); one stage of it is ``NAME@STAGE``
(``gpt3-pp8@3``), which every command that takes ``--workload`` accepts
(:func:`opdvfs.workloads.library.load_workload`).
"""

from __future__ import annotations

import re
from dataclasses import replace

from opdvfs.exceptions import ValidationError
from opdvfs.workloads.transformer import TransformerConfig, transformer_training
from opdvfs.workloads.workload import Workload

__all__ = ["pipeline_workloads", "split_stage_name", "stage_name"]

_STAGE_SUFFIX = re.compile(r"^(?P<name>.+)@(?P<stage>\d+)$")


def stage_name(pipeline: str, stage: int) -> str:
    """Return the workload name of one stage of a pipeline (``gpt3-pp8@3``)."""
    return f"{pipeline}@{stage}"


def split_stage_name(name: str) -> tuple[str, int] | None:
    """Return (pipeline, stage) of a ``NAME@STAGE`` workload name, or None if it is not one."""
    found = _STAGE_SUFFIX.match(name)
    if found is None:
        return None
    return found["name"], int(found["stage"])


def pipeline_workloads(config: TransformerConfig, *, name: str, description: str) -> list[Workload]:
    """Return every stage's workload of one pipeline, stage 0 first.

    Stage ``s`` is ``config`` with ``stage=s`` (its layers, its ``Recv``/``Send`` at
    microbatch boundaries in 1F1B order, the embedding on stage 0 and the head on the last when
    ``config.vocab``, its optimizer), built by
    :func:`~opdvfs.workloads.transformer.transformer_training`, with every ``wait_us`` set to 0:
    a whole-pipeline run makes the waits itself.

    Parameters
    ----------
    config
        The job as one device sees it; ``config.pp`` is the number of stages.
    name
        The pipeline's name; stage ``s``'s workload is named ``NAME@s``.
    description
        What the pipeline is, recorded in each stage's metadata.
    """
    if config.pp < 2:
        raise ValidationError(
            f"pipeline {name!r}: a whole pipeline needs pp >= 2 stages, got {config.pp}",
            field="pp",
        )
    stages = []
    for stage in range(config.pp):
        work = transformer_training(
            replace(config, name=stage_name(name, stage), stage=stage),
            description=f"{description}, stage {stage} of {config.pp}",
        )
        ops = work.ops
        ops["wait_us"] = 0.0
        meta = {
            **work.meta,
            "pipeline": name,
            "stage": stage,
            "n_stages": config.pp,
            "n_microbatches": config.microbatches,
            "pipeline_wait_us": 0.0,
        }
        stages.append(Workload(ops, name=work.name, meta=meta))
    return stages
