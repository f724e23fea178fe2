"""The workload library: named builders, and loading a ``Workload`` file by path."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from opdvfs.exceptions import ValidationError
from opdvfs.workloads.cnn import resnet, shufflenetv2, vgg19
from opdvfs.workloads.pipeline import pipeline_workloads, split_stage_name
from opdvfs.workloads.transformer import TransformerConfig, llama2_decode, transformer_training
from opdvfs.workloads.workload import Workload

__all__ = ["BUILDERS", "PIPELINES", "load_pipeline", "load_workload"]

#: GPT-3 175B on one device of a TP=8 x PP=8 job: stage 3 of 8, 12 of the 96 layers.
GPT3 = TransformerConfig(
    name="gpt3",
    layers=12,
    hidden=12288,
    heads=96,
    ffn=4 * 12288,
    seq=2048,
    micro_batch=2,
    microbatches=32,
    vocab=50257,
    tp=8,
    pp=8,
    stage=3,
)


def gpt3() -> Workload:
    """GPT-3 175B training on one device of a TP=8 x PP=8 job (the paper's GPT-3 case).

    Stage 3 of 8 holds 12 of the 96 layers (hidden 12288, 96 heads, seq 2048); 32 microbatches
    of two sequences run in a 1F1B schedule: about 18k operators per iteration.
    """
    return transformer_training(GPT3, description="GPT-3 175B, TP8 x PP8, stage 3, 1F1B")


def gpt3_pp8() -> list[Workload]:
    """Every stage of one GPT-3 175B pipeline (TP8 x PP8): the 8 devices of one TP rank.

    As :func:`gpt3`, on every stage: 12 layers each, the embedding on stage 0 and the LM head on
    stage 7, sends and receives at the microbatch boundaries, no waits (the run makes them).
    """
    return pipeline_workloads(GPT3, name="gpt3-pp8", description="GPT-3 175B, TP8 x PP8, 1F1B")


def bert() -> Workload:
    """BERT-large pre-training step, sequence 512, batch 16 (single device)."""
    cfg = TransformerConfig(
        name="bert",
        layers=24,
        hidden=1024,
        heads=16,
        ffn=4096,
        seq=512,
        micro_batch=16,
        vocab=30522,
        causal=False,
    )
    return transformer_training(cfg, description="BERT-large, seq 512, batch 16")


def vit_base() -> Workload:
    """ViT-Base/16 training step, 224x224 images (197 tokens), batch 64."""
    cfg = TransformerConfig(
        name="vit_base",
        layers=12,
        hidden=768,
        heads=12,
        ffn=3072,
        seq=197,
        micro_batch=64,
        vocab=1000,
        causal=False,
        patch_embed=16,
    )
    return transformer_training(cfg, description="ViT-Base/16, 224x224, batch 64")


BUILDERS: dict[str, Callable[[], Workload]] = {
    "gpt3": gpt3,
    "bert": bert,
    "resnet50": lambda: resnet(50),
    "resnet152": lambda: resnet(152),
    "vit_base": vit_base,
    "vgg19": vgg19,
    "shufflenetv2": shufflenetv2,
    "llama2-infer": llama2_decode,
}

#: Whole pipelines: every stage's workload, stage 0 first (``NAME@STAGE`` names one stage).
PIPELINES: dict[str, Callable[[], list[Workload]]] = {"gpt3-pp8": gpt3_pp8}


def load_pipeline(name: str) -> list[Workload]:
    """Build every stage's workload of the named pipeline (:data:`PIPELINES`), stage 0 first."""
    if name not in PIPELINES:
        raise ValidationError(
            f"unknown pipeline {name!r}; expected one of {', '.join(PIPELINES)}",
            field="workload",
        )
    return PIPELINES[name]()


def load_workload(name_or_path: str | os.PathLike[str]) -> Workload:
    """Build a named workload, or read a workload file (``.json`` / ``.parquet``) by path.

    ``PIPELINE@STAGE`` (``gpt3-pp8@3``) names one stage of a whole pipeline (:data:`PIPELINES`).
    """
    key = str(name_or_path)
    if key in BUILDERS:
        return BUILDERS[key]()
    staged = split_stage_name(key)
    if staged is not None and staged[0] in PIPELINES:
        stages = PIPELINES[staged[0]]()
        if staged[1] >= len(stages):
            raise ValidationError(
                f"workload {key!r}: pipeline {staged[0]!r} has stages 0-{len(stages) - 1}",
                field="workload",
            )
        return stages[staged[1]]
    if Path(key).suffix in (".json", ".parquet") or Path(key).exists():
        return Workload.read(key)
    raise ValidationError(
        f"unknown workload {key!r}; expected one of {', '.join(BUILDERS)}, a stage "
        f"PIPELINE@STAGE of {', '.join(PIPELINES)}, or a workload file",
        field="workload",
    )
