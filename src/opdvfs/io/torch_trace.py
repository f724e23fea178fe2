"""PyTorch profiler (Kineto) Chrome traces: ``.json`` or ``.json.gz``.

GPU traces: every device event (``kernel``, ``gpu_memcpy``, ``gpu_memset``) is mapped to the
innermost host operator that launched it. Kineto stamps the kernel with the ``External id`` of
that operator (PyTorch pushes a fresh correlation id on every RecordFunction entry); older
traces without it are joined through the ``correlation`` of the launching runtime call. One
profile row is one launching operator: its time is the sum of its device events' durations, its
position is its dispatch order within the iteration.

CPU-only traces: the rows are the outermost ``aten::`` ops on each thread (the sequence a
TorchDispatchMode sees), and ``torch.distributed``'s point-to-point ops (:data:`HOST_MESSAGES`:
a pipeline stage's messages, which a dispatch mode sees too), timed on the host. They name no
peer (the trace records none without shapes).

Iterations are the ``ProfilerStep#N`` spans when present; iterations whose operator sequence
differs from the most common one (warm-up, lazy initialisation) are dropped and counted. The clock
comes from ``--freq-mhz`` or from the trace's ``opdvfs_freq_mhz`` metadata
(``prof.add_metadata_json("opdvfs_freq_mhz", "1410")``).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import Counter
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from opdvfs._table import Column, coerce_column
from opdvfs.exceptions import ProfileFormatError, ValidationError
from opdvfs.io._common import build_profile, other_opdvfs_file
from opdvfs.profile import Profile

FORMAT = "torch-trace"
FREQ_METADATA_KEY = "opdvfs_freq_mhz"

_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_COMM_KERNEL = re.compile(r"nccl|rccl|hccl|all_?reduce|all_?gather|reduce_?scatter", re.I)


def sniff_path(path: Path) -> bool:
    """Return whether a path names a Chrome trace by its suffix."""
    return path.name.endswith((".json", ".json.gz"))


def _read_bytes(path: Path) -> bytes:
    """Return the trace's JSON text, gunzipped when it is gzip data."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileFormatError(f"{path}: no such file") from None
    except OSError as exc:
        raise ProfileFormatError(f"{path}: cannot read ({exc.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileFormatError(f"{path}: truncated or corrupt gzip data ({exc})") from None
    if not raw.strip():
        raise ProfileFormatError(f"{path}: empty file; expected a Chrome trace (JSON)")
    return raw


def load_trace(path: Path) -> dict[str, Any]:
    """Load a Chrome trace (plain or gzip JSON) into a dict with a ``traceEvents`` list."""
    raw = _read_bytes(path)
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(
            f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})"
        ) from None
    except (UnicodeDecodeError, RecursionError):
        raise ProfileFormatError(f"{path}: not a JSON text file") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise other_opdvfs_file(path, doc) or ProfileFormatError(
            f"{path}: expected a PyTorch profiler trace (a JSON object with a 'traceEvents' list)"
        )
    return doc


class _Args(msgspec.Struct, gc=False):
    """The two ``args`` of an event the importer reads; the others are skipped undecoded."""

    ext: int | None = msgspec.field(default=None, name="External id")
    corr: int | None = msgspec.field(default=None, name="correlation")


class _Event(msgspec.Struct, gc=False):
    """The fields of a trace event the importer reads, in the types Kineto writes them."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw]  # each event's text, decoded a batch at a time
    freq_mhz: Any = msgspec.field(default=None, name=FREQ_METADATA_KEY)
    base_ns: Any = msgspec.field(default=None, name="baseTimeNanoseconds")
    device_properties: Any = msgspec.field(default=None, name="deviceProperties")


_TRACE = msgspec.json.Decoder(_Trace | list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[_Event])
_BATCH = 65536


class _Columns:
    """The 'X' events' fields, appended a batch of decoded events at a time."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}
        self.text: dict[str | int, str | int] = {}  # one object per distinct name, cat, pid, tid

    def add(self, field: str, values: np.ndarray) -> None:
        self.parts.setdefault(field, []).append(values)

    def add_batch(self, offset: int, batch: list[_Event]) -> bool:
        """Append the batch's 'X' events; False where one needs :func:`_events_frame`."""
        ph = np.fromiter(map(attrgetter("ph"), batch), dtype=object, count=len(batch))
        is_x: np.ndarray = ph == "X"
        xs = list(compress(batch, is_x))
        n = len(xs)
        self.add("event", np.flatnonzero(is_x) + offset)
        try:
            for key in ("ts", "dur"):
                self.add(key, np.fromiter(map(attrgetter(key), xs), dtype=np.float64, count=n))
        except TypeError:  # a missing ts / dur: _events_frame names the event
            return False
        for key in ("cat", "name", "pid", "tid"):
            values = list(map(attrgetter(key), xs))
            if key in ("pid", "tid") and None in values:
                return False  # from_records reads [1, None] as floats: leave those to it
            shared = map(self.text.setdefault, values, values)
            self.add(key, np.fromiter(shared, dtype=object, count=n))
        args = [_NO_ARGS if a is None else a for a in map(attrgetter("args"), xs)]
        for key in ("ext", "corr"):
            ids = np.fromiter(map(attrgetter(key), args), dtype=object, count=n)
            missing = pd.isna(ids)
            ids[missing] = 0
            try:
                self.add(key, ids.astype(np.int64))
            except OverflowError:  # beyond int64: _events_frame reads it as before
                return False
            self.add(key + "_missing", missing)
        return True

    def frame(self) -> pd.DataFrame:
        cols = {k: np.concatenate(v) for k, v in self.parts.items()}
        ids = {
            k: pd.arrays.IntegerArray(cols.pop(k), cols.pop(k + "_missing"))
            for k in ("ext", "corr")
        }
        index = pd.Index(cols.pop("event"), name="event")
        return pd.DataFrame({**cols, **ids}, index=index)


_NO_ARGS = _Args()


def _load_typed(path: Path) -> tuple[dict[str, Any], pd.DataFrame] | None:
    """Return the trace's metadata (as in :func:`load_trace`) and its 'X' events, unchecked.

    msgspec reads the document with each event kept as its text, then decodes the events a batch
    at a time into typed objects holding only the fields the importer uses, and the frame is
    built from per-field arrays: no dict per event, and at most one batch of event objects at a
    time. It covers traces whose events carry those fields in the types Kineto writes (numbers,
    strings, integer ids); for any other (a malformed file, a string ``ts``, an 'X' event
    without ``ts``) it returns None and :func:`load_trace` with :func:`_events_frame` read the
    file as before, with their messages.
    """
    raw = _read_bytes(path)
    try:
        decoded = _TRACE.decode(raw)
        trace = _Trace(decoded) if isinstance(decoded, list) else decoded
        del decoded
        events = trace.traceEvents
        doc = {
            FREQ_METADATA_KEY: trace.freq_mhz,
            "baseTimeNanoseconds": trace.base_ns,
            "deviceProperties": trace.device_properties,
            "n_events": len(events),
        }
        columns = _Columns()
        for offset in range(0, max(len(events), 1), _BATCH):
            text = b"[" + b",".join(events[offset : offset + _BATCH]) + b"]"
            if not columns.add_batch(offset, _EVENTS.decode(text)):
                return None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    del raw, trace, events
    return doc, columns.frame()


def _events_frame(path: Path, events: list[Any]) -> pd.DataFrame:
    """Complete ('X') events as a frame indexed by their position in ``traceEvents``."""
    rows = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise ProfileFormatError(f"{path}: event {i}: expected a JSON object, got {ev!r:.40}")
        if ev.get("ph") != "X":
            continue
        args = ev.get("args")
        if args is not None and not isinstance(args, dict):
            raise ProfileFormatError(f"{path}: event {i}, field 'args': expected an object")
        args = args or {}
        rows.append(
            (
                i,
                ev.get("cat"),
                ev.get("name"),
                ev.get("pid"),
                ev.get("tid"),
                ev.get("ts"),
                ev.get("dur"),
                args.get("External id"),
                args.get("correlation"),
                args.get("stream"),
            )
        )
    columns = ["event", "cat", "name", "pid", "tid", "ts", "dur", "ext", "corr", "stream"]
    return pd.DataFrame.from_records(rows, columns=columns).set_index("event")


def _checked_frame(path: Path, frame: pd.DataFrame) -> pd.DataFrame:
    """Check ``ts`` and ``dur`` as numbers and turn the text columns into text."""
    if frame.empty:
        raise ProfileFormatError(f"{path}: no complete ('X') events in 'traceEvents'")
    for field, spec in (
        ("ts", Column("ts", "float")),
        ("dur", Column("dur", "float", min_value=0.0)),
    ):
        try:
            frame[field] = coerce_column(frame[field], spec, "")
        except ValidationError as exc:
            raise ProfileFormatError(
                f"{path}: event {exc.row}, field {field!r}: {exc.detail}"
            ) from None
    frame["cat"] = frame["cat"].astype(str)
    frame["name"] = frame["name"].astype(str)
    for key in ("pid", "tid"):
        frame[key] = frame[key].astype(str)
    return frame


def _to_int_ids(series: pd.Series) -> pd.Series:
    """Return the ids as whole numbers (NA where none: infinite, fractional, past int64)."""
    values = pd.to_numeric(series, errors="coerce").astype("float64")
    whole = np.isfinite(values) & (values.abs() < 2.0**63) & (values == np.floor(values))
    return values.where(whole).astype("Int64")


def _device_rows(ev: pd.DataFrame, dropped: Counter[str]) -> pd.DataFrame | None:
    """One row per launching host op: summed device time, first device start, kernel count."""
    dev = ev[ev["cat"].isin(_DEVICE_CATS)]
    if dev.empty:
        return None
    host = ev[ev["cat"] == "cpu_op"].copy()
    host["ext"] = _to_int_ids(host["ext"])
    host = host[host["ext"].notna()].reset_index().drop_duplicates("ext").set_index("ext")
    ext = _to_int_ids(dev["ext"])
    if ext.isna().any():
        # Older traces: kernel -> runtime launch (correlation) -> the op's External id.
        runtime = ev[ev["cat"].isin(("cuda_runtime", "cuda_driver"))].copy()
        runtime = runtime.assign(corr=_to_int_ids(runtime["corr"]), ext=_to_int_ids(runtime["ext"]))
        by_corr = runtime.dropna(subset=["corr"]).drop_duplicates("corr").set_index("corr")["ext"]
        via = _to_int_ids(dev["corr"]).map(by_corr)
        ext = ext.fillna(via)
    dev = dev.assign(ext=ext)
    launched = dev["ext"].isin(host.index)
    if (~launched).any():
        dropped["device events with no launching operator"] += int((~launched).sum())
    dev = dev[launched]
    if dev.empty:
        return None
    dev = dev.assign(comm=dev["name"].str.contains(_COMM_KERNEL))
    per_op = dev.groupby("ext").agg(
        time_us=("dur", "sum"),
        device_start_us=("ts", "min"),
        kernels=("dur", "size"),
        comm=("comm", "any"),
    )
    ops = host.loc[per_op.index, ["event", "name", "ts"]].join(per_op)
    ops["stream"] = np.where(ops["comm"], "comm", "compute")
    return ops.drop(columns="comm").set_index("event")


#: The point-to-point operators a CPU trace keeps beside the aten ops (``torch.distributed``'s
#: send and receives: a pipeline stage's messages, its receives' waits in their time).
HOST_MESSAGES = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")


def _host_rows(ev: pd.DataFrame) -> pd.DataFrame:
    """Outermost aten ops and messages (:data:`HOST_MESSAGES`) on their thread, host-timed.

    This is close to what a TorchDispatchMode sees: it intercepts an aten op and not the aten
    calls nested inside it. Wrappers that are not aten ops (``ProfilerStep#N``, autograd engine
    frames, ``Optimizer.step``) are looked through.
    """
    names = ev["name"]
    kept = names.str.startswith("aten::") | names.isin(HOST_MESSAGES)
    host = ev[(ev["cat"] == "cpu_op") & kept].copy()
    if host.empty:
        raise ProfileFormatError("no 'cpu_op' events named aten::*")
    host["end"] = host["ts"] + host["dur"]
    host = host.reset_index().sort_values(
        ["pid", "tid", "ts", "dur"], ascending=[True, True, True, False]
    )
    thread = host.groupby(["pid", "tid"], sort=False)["end"]
    # In a properly nested tree an op is inside an earlier one iff some earlier op on its thread
    # ends after it starts.
    prev_end = thread.transform(lambda e: e.cummax().shift(1)).fillna(-np.inf)
    top = host[~(prev_end.to_numpy() > host["ts"].to_numpy())]
    return pd.DataFrame(
        {
            "name": top["name"].to_numpy(),
            "ts": top["ts"].to_numpy(),
            "time_us": top["dur"].to_numpy(),
            "device_start_us": top["ts"].to_numpy(),
            "kernels": 0,
            # The ops ran on the CPU as the compute device, not as host time a device waits on.
            "stream": "compute",
        },
        index=pd.Index(top["event"].to_numpy(), name="event"),
    )


def _assign_iterations(ev: pd.DataFrame, ops: pd.DataFrame, dropped: Counter[str]) -> pd.DataFrame:
    steps = ev[(ev["cat"] == "user_annotation") & ev["name"].str.match(_STEP.pattern)]
    if steps.empty:
        return ops.assign(iteration=0)
    steps = steps.sort_values("ts")
    starts = steps["ts"].to_numpy()
    ends = starts + steps["dur"].to_numpy()
    numbers = steps["name"].str.extract(_STEP)[0].astype(int).to_numpy()
    pos = np.searchsorted(starts, ops["ts"].to_numpy(), side="right") - 1
    inside = (pos >= 0) & (ops["ts"].to_numpy() <= ends[np.clip(pos, 0, None)])
    if (~inside).any():
        dropped["operators outside ProfilerStep spans"] += int((~inside).sum())
    ops = ops[inside].copy()
    ops["iteration"] = numbers[pos[inside]] - numbers.min()
    return ops


def _keep_modal_sequence(ops: pd.DataFrame, dropped: Counter[str]) -> pd.DataFrame:
    """Keep the iterations whose op-name sequence is the most common one."""
    ops = ops.sort_values(["iteration", "ts"], kind="stable")
    signature = ops.groupby("iteration")["name"].agg(lambda s: hash(tuple(s)))
    modal = signature.value_counts().index[0]
    keep = signature[signature == modal].index
    mask = ops["iteration"].isin(keep)
    if (~mask).any():
        dropped["rows in iterations whose op sequence differs"] += int((~mask).sum())
    ops = ops[mask].copy()
    ops["iteration"] = pd.factorize(ops["iteration"], sort=True)[0]
    return ops


def read(path: Path, *, freq_mhz: float | None = None) -> Profile:
    """Read a PyTorch profiler Chrome trace measured at core clock ``freq_mhz``."""
    typed = _load_typed(path)
    doc = load_trace(path) if typed is None else typed[0]
    clock = freq_mhz if freq_mhz is not None else doc.get(FREQ_METADATA_KEY)
    if clock is None:
        raise ProfileFormatError(
            f"{path}: the trace does not record the core clock; pass --freq-mhz or add "
            f'prof.add_metadata_json("{FREQ_METADATA_KEY}", "<MHz>") when capturing'
        )
    if typed is None:
        n_events = len(doc["traceEvents"])
        ev = _checked_frame(path, _events_frame(path, doc["traceEvents"]))
        del doc["traceEvents"]
    else:
        n_events = doc["n_events"]
        ev = _checked_frame(path, typed[1])
    del typed
    dropped: Counter[str] = Counter()
    ops = _device_rows(ev, dropped)
    if ops is None:
        try:
            ops = _host_rows(ev)
        except ProfileFormatError as exc:
            raise ProfileFormatError(
                f"{path}: {exc}; expected kernels or aten cpu_op events"
            ) from None
    ops = _assign_iterations(ev, ops, dropped)
    if ops.empty:
        raise ProfileFormatError(f"{path}: no operators inside the ProfilerStep spans")
    ops = _keep_modal_sequence(ops, dropped)
    ops["op"] = ops.groupby("iteration").cumcount()
    ops["start_us"] = ops["device_start_us"] - ops.groupby("iteration")[
        "device_start_us"
    ].transform("min")
    ops["freq_mhz"] = clock
    columns = ["iteration", "op", "name", "stream", "freq_mhz", "time_us", "start_us", "kernels"]
    base_ns = doc.get("baseTimeNanoseconds")
    if isinstance(base_ns, int | float):
        # Kineto's ts are microseconds after baseTimeNanoseconds (Unix epoch), device events
        # synchronised to the host clock: wall_s lines ops up with time.time() sensor samples
        ops["wall_s"] = base_ns * 1e-9 + ops["device_start_us"] * 1e-6
        columns.append("wall_s")
    frame = ops[columns]
    props = doc.get("deviceProperties")
    device = None
    if isinstance(props, list) and props and isinstance(props[0], dict):
        device = props[0].get("name")
    meta = {
        "format": FORMAT,
        "sources": [path.name],
        "device": device,
        "dropped": dict(dropped),
        "trace": {"gpu": bool(frame["kernels"].sum() > 0), "events": n_events},
    }
    source = {"freq_mhz": FREQ_METADATA_KEY, "time_us": "dur", "name": "name"}
    return build_profile(frame, path=path, source_columns=source, meta=meta, row_word="event")
