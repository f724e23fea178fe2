"""Which phase of generation a model forward is: prefill or decode (pure functions).

A generation loop (Hugging Face ``generate()``, a serving engine's step) calls the model once
per step. The first call of a request runs the whole prompt through the model (**prefill**:
many tokens, compute-bound); every later call feeds the one token just sampled, reading the
KV cache (**decode**: memory-bound). :func:`classify_phase` tells them apart from what the
forward is given; :func:`forward_tokens` reads that from the forward's arguments as
``transformers`` models take them (``input_ids`` or ``inputs_embeds``, ``cache_position``
or ``position_ids``). :func:`bucket_key` says which plan a step shares: decode steps whose
operators are the same (only the sequence length differs) share one, unless their length
changes the plan (:meth:`~opdvfs.tuner.generate.GenerateTuner._check_lengths`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["PHASES", "ForwardTokens", "Phase", "bucket_key", "classify_phase", "forward_tokens"]

#: A generation step's phase.
Phase = Literal["prefill", "decode"]
#: Both phases, in the order a request runs them.
PHASES: tuple[Phase, Phase] = ("prefill", "decode")


@dataclass(frozen=True)
class ForwardTokens:
    """What one forward is given: its batch, its new tokens per row, where in the sequence.

    ``seq_len`` None: no token tensor was found; ``first_position`` None: no
    ``cache_position``.
    """

    batch: int = 1
    seq_len: int | None = None
    first_position: int | None = None


def classify_phase(
    seq_len: int | None, *, first_of_request: bool = False, first_position: int | None = None
) -> Phase:
    """Return the phase of one forward: ``prefill`` or ``decode``.

    Prefill: the first forward of a request (``first_of_request``, or a position starting at
    0), or more than one new token per row (``seq_len > 1``; a forward whose
    tokens are unknown counts as prefill, the safe side: it keeps the top clock's plan).
    Decode: one new token per row over the KV cache.
    """
    if first_of_request or first_position == 0:
        return "prefill"
    if seq_len is None or seq_len > 1:
        return "prefill"
    return "decode"


def _tensor_dims(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None


def forward_tokens(args: Sequence[Any], kwargs: Mapping[str, Any]) -> ForwardTokens:
    """Return the batch and new tokens of a model forward from its arguments.

    The token tensor is ``input_ids``, else ``inputs_embeds``, else the first positional
    argument with a shape: ``[batch, seq]`` (ids) or ``[batch, seq, hidden]`` (embeddings); a
    1-d tensor is one row. The first element of ``cache_position`` (else ``position_ids``),
    where given, is where the new tokens start in the sequence (0: the request's first
    forward).
    """
    tokens = kwargs.get("input_ids")
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    if tokens is None:
        tokens = next((a for a in args if _tensor_dims(a) is not None), None)
    dims = _tensor_dims(tokens) if tokens is not None else None
    batch, seq_len = 1, None
    if dims:
        batch, seq_len = (dims[0], dims[1]) if len(dims) >= 2 else (1, dims[0])
    first: int | None = None
    position = kwargs.get("cache_position")
    if position is None:
        position = kwargs.get("position_ids")
    pos_dims = _tensor_dims(position) if position is not None else None
    if position is not None and pos_dims and pos_dims[-1] > 0:
        try:
            first = int(position.reshape(-1)[0])
        except (TypeError, ValueError, RuntimeError):
            first = None
    return ForwardTokens(batch=max(batch, 1), seq_len=seq_len, first_position=first)


def bucket_key(phase: Phase, n_launches: int) -> tuple[Phase, int]:
    """Return the plan a step shares: its phase and its operator count.

    A per-operator plan maps onto an operator sequence; decode steps that differ only in the
    sequence length run the same operators (their shapes grow, their count does not), so all
    share one plan. A length at which the model runs other operators (another attention path)
    is another bucket, planned only if it recurs; meanwhile its phase's static clock applies.
    """
    return (phase, int(n_launches))
