"""``Workload``: the ordered operators of one iteration, with the work each one does.

The simulator turns a workload into time and power at any clock; capture records one from a real
PyTorch program. Files are Parquet (``.parquet``) or JSON (anything else), both lossless.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from opdvfs._files import write_atomic, write_text_atomic
from opdvfs._table import Column, TableSchema, metadata_json_ready
from opdvfs.exceptions import InputFormatError, ValidationError
from opdvfs.profile import OPERATOR_COLUMNS, _categorical_text

if TYPE_CHECKING:  # pandas loads with the first workload, not with `opdvfs schema`
    import pandas as pd

__all__ = ["PHASES", "WORKLOAD_COLUMNS", "Workload"]

#: Training phases an operator belongs to (``other`` for inference or unknown).
PHASES = ("forward", "backward", "optimizer", "other")

WORKLOAD_COLUMNS = TableSchema(
    what="workload",
    columns=(
        *OPERATOR_COLUMNS,
        Column(
            "phase",
            "str",
            required=False,
            default="other",
            choices=PHASES,
            description="forward, backward, optimizer or other",
        ),
        Column(
            "flops",
            "float",
            required=False,
            default=0.0,
            min_value=0.0,
            description="floating-point operations",
        ),
        Column(
            "bytes_loaded",
            "float",
            required=False,
            default=0.0,
            min_value=0.0,
            description="bytes read from device memory",
        ),
        Column(
            "bytes_stored",
            "float",
            required=False,
            default=0.0,
            min_value=0.0,
            description="bytes written to device memory",
        ),
        Column(
            "activity",
            "float",
            required=False,
            default=1.0,
            min_value=0.0,
            description="switching activity relative to the op type's typical (1 = typical)",
        ),
        Column(
            "host_us",
            "float",
            required=False,
            default=0.0,
            min_value=0.0,
            description="host time to dispatch the op (us); binds when the host is the bottleneck",
        ),
        Column(
            "wait_us",
            "float",
            required=False,
            default=0.0,
            min_value=0.0,
            description="time a communication op waits for its peer (pipeline bubble), us; "
            "independent of this device's clock",
        ),
        Column(
            "gap_before_us",
            "float",
            required=False,
            default=0.0,
            min_value=0.0,
            description="idle time before the operator starts (us)",
        ),
        Column("shapes", "str", required=False, description="input shapes, as text"),
    ),
    float_prefixes=("ratio_",),
)

#: Text columns, held as categoricals.
_TEXT = tuple(c.name for c in WORKLOAD_COLUMNS.columns if c.kind == "str")
_META_KEY = b"opdvfs.workload"
_JSON_FORMAT = "opdvfs.workload"


class Workload:
    """The operators of one iteration, in dispatch order.

    Parameters
    ----------
    ops
        One row per operator in order; columns as in :data:`WORKLOAD_COLUMNS` (only ``name``
        required). The operator's position is its row number.
    name
        Workload name (``gpt3``, ``captured``).
    meta
        JSON-ready metadata (source, model configuration, notes).
    """

    def __init__(
        self, ops: pd.DataFrame, *, name: str, meta: Mapping[str, Any] | None = None
    ) -> None:
        if not name:
            raise ValidationError("workload: name must be non-empty", field="name")
        if len(ops) == 0:
            raise ValidationError("workload: expected at least one operator", field="name")
        # categorical text: a 1M-op workload holds a few hundred distinct names, not a string
        # object per row (~600 MiB)
        table = WORKLOAD_COLUMNS.validate(_categorical_text(ops, _TEXT))
        if "type" not in table.columns:
            table.insert(1, "type", table["name"])
        self._ops = table.reset_index(drop=True)
        self.name = name
        self._meta: dict[str, Any] = metadata_json_ready(meta or {})

    @property
    def ops(self) -> pd.DataFrame:
        """The operator table (a lazy copy: copy-on-write); the index is the operator position.

        Text columns (``name``, ``type``, ``stream``, ``phase``, ``shapes``) are categoricals.
        """
        return self._ops.copy(deep=False)

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata (a deep copy)."""
        return json.loads(json.dumps(self._meta))

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"Workload(name={self.name!r}, ops={len(self)})"

    def equals(self, other: Workload) -> bool:
        """Return whether two workloads hold identical operators, name and metadata."""
        return (
            self.name == other.name and self._meta == other._meta and self._ops.equals(other._ops)
        )

    @property
    def total_flops(self) -> float:
        """Sum of FLOPs over the iteration."""
        return float(np.sum(self._ops["flops"].to_numpy()))

    # ----------------------------------------------------------------------------- files
    def write(self, path: str | os.PathLike[str]) -> None:
        """Write to Parquet (``.parquet``) or JSON (any other suffix), atomically."""
        dest = Path(path)
        if dest.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(self._ops, preserve_index=False)
            header = json.dumps({"name": self.name, "meta": self._meta}).encode()
            table = table.replace_schema_metadata(
                {**(table.schema.metadata or {}), _META_KEY: header}
            )
            write_atomic(dest, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
            return
        doc = {
            "format": _JSON_FORMAT,
            "version": 1,
            "name": self.name,
            "meta": self._meta,
            # NaN (a missing ratio) is not JSON; it travels as null and reads back as NaN.
            "ops": self._ops.astype(object).where(self._ops.notna(), None).to_dict(orient="list"),
        }
        write_text_atomic(dest, json.dumps(doc, allow_nan=False) + "\n")

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Workload:
        """Read a workload file written by :meth:`write`.

        Raises
        ------
        InputFormatError
            If the file is missing, malformed, or holds operators that fail validation.
        """
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        src = Path(path)
        if not src.is_file():
            raise InputFormatError(f"{src}: no such file")
        try:
            if src.suffix == ".parquet":
                table = pq.read_table(src)
                header = json.loads((table.schema.metadata or {}).get(_META_KEY, b"{}"))
                frame = table.to_pandas()
                name, meta = header.get("name") or src.stem, header.get("meta", {})
            else:
                doc = json.loads(src.read_text(encoding="utf-8"))
                if not isinstance(doc, dict) or doc.get("format") != _JSON_FORMAT:
                    raise InputFormatError(
                        f'{src}: expected a JSON object with "format": "{_JSON_FORMAT}"'
                    )
                ops = doc.get("ops")
                if not isinstance(ops, dict):
                    raise InputFormatError(f"{src}: field 'ops': expected an object of columns")
                frame = pd.DataFrame(ops)
                name, meta = str(doc.get("name") or src.stem), doc.get("meta", {})
        except (ValueError, pa.ArrowException, OSError) as exc:
            if isinstance(exc, InputFormatError):
                raise
            raise InputFormatError(f"{src}: not a workload file ({exc})") from None
        try:
            return cls(frame, name=name, meta=meta)
        except ValidationError as exc:
            raise InputFormatError(f"{src}: {exc}") from None
