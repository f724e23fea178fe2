"""Shared pieces of the command line: the typer app, error reporting, common options.

Every command reports bad input as one line on stderr and exit status 2, never a traceback:
:func:`fail` is the one place that prints an error. Errors reach it two ways: an
:class:`~opdvfs.exceptions.OpdvfsError` raised by a command (:func:`reports_errors`), and a
usage error that typer finds while parsing (a bad choice, a value out of range, a missing or
unknown option), which :class:`OpdvfsGroup` catches before typer draws its multi-line box.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import numpy as np
import pydantic
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from opdvfs import __version__
from opdvfs._model import describe_validation_error
from opdvfs.exceptions import OpdvfsError
from opdvfs.io import FORMATS
from opdvfs.schedule import Objective

# Every command imports what it runs (pandas, scipy, the simulator) in its body, so that
# `opdvfs --version`, `--help` and the listings start in a fraction of a second.
if TYPE_CHECKING:
    from opdvfs.profile import Profile
    from opdvfs.sim.twin import SimulatedDevice

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click import exceptions as _click_errors  # type: ignore[no-redef]

# Tables get 120 columns when the output is not a terminal (pipes, CI logs), not rich's 80.
stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 120)


stderr = Console(stderr=True, soft_wrap=True)


P = ParamSpec("P")


R = TypeVar("R")


class UsageError(OpdvfsError, ValueError):
    """A command-line value is malformed (exit status 2)."""


def note(text: str) -> None:
    """Print ``opdvfs: TEXT`` as one line on stderr: what a run did not do, not an error."""
    stderr.print(f"opdvfs: {text}", markup=False, highlight=False, soft_wrap=True)


def fail(message: str) -> typer.Exit:
    """Print ``opdvfs: error: MESSAGE`` as one line on stderr; return the exit (status 2) to raise.

    Line breaks inside ``message`` (a library error that wraps another's text) are folded, so
    the contract of one line holds whatever the message.
    """
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    stderr.print(f"opdvfs: error: {text}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _usage_message(exc: Exception) -> str:
    """Return a typer/click usage error as ``COMMAND: what was wrong``, without typer's box."""
    format_message = getattr(exc, "format_message", None)
    message = format_message() if callable(format_message) else str(exc)
    # typer validates values with pydantic, whose messages start "Value error, "
    message = message.replace("Value error, ", "")
    # ... and whose range errors do not repeat the value given
    errors = getattr(exc.__cause__, "errors", None)
    given = errors()[0].get("input") if callable(errors) and errors() else None
    if isinstance(given, str | int | float) and str(given) not in message:
        message = f"{message.rstrip('.')}, got {given!r}"
    ctx = getattr(exc, "ctx", None)
    command = " ".join(ctx.command_path.split()[1:]) if ctx is not None else ""
    return f"{command}: {message}" if command else message


@contextlib.contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except _click_errors.ClickException as exc:
        # `opdvfs` or `opdvfs validate` alone: the help is already printed, keep typer's way
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise
        raise fail(_usage_message(exc)) from None


def _require_finite(param: Any) -> None:
    """Make a parameter refuse NaN and infinities (typer accepts ``--min-us nan``)."""
    check_next = param.callback

    def callback(ctx: Any, p: Any, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise typer.BadParameter(f"expected a finite number, got {value}", ctx=ctx, param=p)
        return check_next(ctx, p, value) if check_next is not None else value

    param.callback = callback


class OpdvfsGroup(TyperGroup):
    """The ``opdvfs`` command group: typer's, with usage errors as one ``opdvfs: error:`` line.

    Every parsing step of every command (sub-groups included) runs inside the root group's
    ``make_context`` or ``invoke``, so translating there reaches commands defined anywhere.
    ``--help`` and the help shown for a bare ``opdvfs`` are typer's, unchanged.
    """

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        pending: list[Any] = [self]
        while pending:
            command = pending.pop()
            for param in command.params:
                _require_finite(param)
            pending.extend(getattr(command, "commands", {}).values())

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        """Parse the root's own arguments; a usage error becomes one line."""
        with _one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        """Parse and run the subcommand; a usage error becomes one line."""
        with _one_line_usage_errors():
            return super().invoke(ctx)


app = typer.Typer(
    name="opdvfs",
    cls=OpdvfsGroup,
    help="Per-operator DVFS: profile, model, plan and apply core-clock schedules.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn opdvfs errors into one stderr line and exit status 2.

    A pydantic ``ValidationError`` that escapes a data object built from the command's input
    (rather than read from a file, which names the file itself) is reported the same way, as
    the object and the first offending field, instead of pydantic's multi-line dump.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except OpdvfsError as exc:
            raise fail(str(exc)) from None
        except pydantic.ValidationError as exc:
            raise fail(f"{exc.title}: {describe_validation_error(exc)}") from None

    return wrapper


def parse_clocks(
    text: str, available_mhz: Sequence[float] | np.ndarray | None = None
) -> list[float]:
    """Parse a clock list such as ``1000,1400,1800``, ``min,mid,max`` or ``auto`` (MHz).

    The words need ``available_mhz`` (the device's or profile's clocks): ``mid`` is the
    available clock nearest the middle of the range; ``auto`` the clocks a profile for planning
    needs (:func:`opdvfs.plan.on_profile.auto_clocks`: the top, two 7.5% and 15% below it,
    mid and min, and clocks between them until no gap is wider than the models bridge).
    """
    clocks: list[float] = []
    grid = np.asarray(sorted(available_mhz)) if available_mhz is not None else None
    for item in (t.strip() for t in text.split(",")):
        if item.lower() in ("min", "mid", "max", "auto"):
            if grid is None or grid.size == 0:
                raise UsageError(f"clock {item!r}: words need a device or profile clock list")
            if item.lower() == "auto":
                from opdvfs.plan.on_profile import auto_clocks

                clocks.extend(sorted(auto_clocks(grid.tolist())))
                continue
            middle = grid[np.argmin(np.abs(grid - (grid[0] + grid[-1]) / 2))]
            clocks.append(float({"min": grid[0], "mid": middle, "max": grid[-1]}[item.lower()]))
            continue
        try:
            value = float(item)
        except ValueError:
            raise UsageError(
                f"clock {item!r}: expected a number of MHz or min, mid, max, auto (e.g. 1000,1800)"
            ) from None
        if not np.isfinite(value) or value <= 0:
            raise UsageError(f"clock {item!r}: expected a positive number of MHz")
        clocks.append(value)
    return clocks


def spinner() -> Progress:
    """Return a transient spinner with the elapsed time on stderr (hidden off a terminal)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    )


def load_profile(
    sources: Sequence[Path], fmt: str | None, freq_mhz: str | None, *, samples: bool = True
) -> Profile:
    """Read the profile files of a command (``samples``: see :func:`opdvfs.io.read_profile`)."""
    from opdvfs.io import read_profile

    clocks = parse_clocks(freq_mhz) if freq_mhz else None
    with spinner() as progress:
        progress.add_task(f"reading {len(sources)} file(s)", total=None)
        return read_profile(list(sources), format=fmt, freqs_mhz=clocks, samples=samples)


def need_clocks(profile: Profile, path: Path) -> None:
    """Refuse a profile measured at one clock where models are fitted: say how to get more.

    One clock is what a plain capture on an unlocked GPU gives (its own boost clock); every
    model here is a function of the clock, so the next step is a sweep, not a fit.
    """
    clocks = np.unique(np.asarray(profile.freqs_mhz, dtype=float))
    if clocks.size < 2:
        raise UsageError(
            f"{path}: measured at one core clock ({clocks[0]:g} MHz); models and plans need 2 "
            "or more: profile the workload at other clocks (`opdvfs capture --profile P "
            "--freqs auto`) or let `opdvfs tune` sweep them in one run"
        )


FormatOption = Annotated[
    str | None,
    typer.Option(
        "--format", "-f", help=f"Input format: {', '.join(FORMATS)} (detected if omitted)."
    ),
]


FreqOption = Annotated[
    str | None,
    typer.Option(
        "--freq-mhz",
        help="Core clock of each input (MHz), for formats that do not record it; one value or "
        "one per file.",
    ),
]


JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


ObjectiveOption = Annotated[
    Objective,
    typer.Option("--objective", help="energy (chip), core-energy, power (mean chip) or paper."),
]


WorkScaleOption = Annotated[
    float | None,
    typer.Option(
        "--work-scale",
        min=0.0,
        help="With --actuator sim:PRESET: each operator does this many times its work, so "
        "a CPU-sized model stands for a larger one (longer iterations on the device).",
    ),
]

#: Context settings of a command that runs the user's script: ``-- python train.py ARGS``
#: passes through unparsed.
SCRIPT_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}

GpuOption = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        "--gpu-index",
        help="The NVIDIA GPU to drive and measure: an NVML index (as nvidia-smi -i) or UUID "
        "(GPU-..., MIG-...), or a comma list, one per local rank (LOCAL_RANK picks); default: "
        "this process's CUDA device (LOCAL_RANK under torchrun) matched to NVML by UUID "
        "through CUDA_VISIBLE_DEVICES.",
    ),
]


def announce_gpu(actuator: Any) -> None:
    """Print one stderr line saying which GPU this rank drives (or measures), if it has one."""
    from opdvfs.runtime.actuators.nvml import meter_gpu
    from opdvfs.tuner.ranks import launched_as

    gpu = meter_gpu(actuator.meter)
    if gpu is None:
        return
    rank, world = launched_as()
    who = f"rank {rank} of {world}" if world > 1 else "this process"
    verb = "drives" if actuator.kind in ("nvml", "zeusd") else "measures"
    stderr.print(
        f"opdvfs: {who} {verb} {gpu.label}: {gpu.reason}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


DryRunDeviceOption = Annotated[
    str | None, typer.Option("--device", "-d", help="With --actuator dry-run: its clocks.")
]


def _version(value: bool) -> None:
    if value:
        stdout.print(f"opdvfs {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """Per-operator DVFS: profile, model, plan and apply core-clock schedules."""


def write_profile(
    profile: Profile, out: Path, as_json: bool, describe: Callable[[dict[str, Any]], str]
) -> None:
    """Write a profile atomically, then print its summary as JSON or one line (+ drops)."""
    profile.write(out)
    summary = profile.summary()
    if as_json:
        print(json.dumps({"out": str(out), **summary}))
        return
    stdout.print(f"wrote {out}: {describe(summary)}", highlight=False)
    for reason, count in summary["rows_dropped"].items():
        stdout.print(f"  dropped {count} rows: {reason}", highlight=False)


DeviceOption = Annotated[
    str, typer.Option("--device", "-d", help="Device preset (see `opdvfs devices`).")
]


SeedOption = Annotated[int, typer.Option("--seed", min=0, help="Seed of the simulator's noise.")]


def simulator(device: str, seed: int) -> SimulatedDevice:
    from opdvfs.sim.twin import SimulatedDevice

    return SimulatedDevice.from_preset(device, seed=seed)


def train_clocks(text: str | None, profile: Profile) -> list[float] | None:
    """Parse ``--train-freqs``: MHz, min/mid/max, and ``top``, ``top-N`` (N steps below the top).

    Step names count the profile's clocks down from its highest (``top-1`` is the next one).
    """
    if text is None:
        return None
    grid = np.asarray(profile.freqs_mhz, dtype=float)
    items = []
    for item in (t.strip() for t in text.split(",")):
        word = item.lower().replace(" ", "")
        if word == "top" or word.startswith("top-"):
            steps = word[4:] or "0"
            if not steps.isdigit() or int(steps) >= len(grid):
                raise UsageError(
                    f"clock {item!r}: expected top or top-N with N below {len(grid)} (the "
                    "profile's clocks)"
                )
            items.append(f"{grid[len(grid) - 1 - int(steps)]:g}")
        else:
            items.append(item)
    return parse_clocks(",".join(items), profile.freqs_mhz)
