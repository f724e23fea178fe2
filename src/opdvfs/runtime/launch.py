"""Run the user's program as ``python`` would, in this process or under another launcher.

``opdvfs capture|run -- python [FLAGS] train.py ARGS`` runs the script in opdvfs's own
interpreter (the dispatch mode must see its operators) with CPython's start-up semantics, through
:mod:`runpy`: ``sys.argv`` is ``[train.py, ARGS...]`` and ``sys.path[0]`` the script's folder
(so a sibling ``mymodel.py`` imports), ``-m module`` runs a module with the working folder on the
path, ``-c CODE`` runs code, and the flags that can still take effect in a running interpreter are
applied (``-u``, ``-B``, ``-P``, ``-q``, ``-W ARG``, ``-X OPT``). Flags that only the interpreter's
start can apply (``-O``, ``-E``, ``-I`` ...) are refused with the way to pass them instead.

Any other program after ``--`` (``accelerate launch``, ``deepspeed``, a shell script) is a
*launcher*: it is started as a child process with :func:`activation_env`, the
``opentelemetry-instrument`` / ``ddtrace-run`` pattern: a folder holding a ``sitecustomize.py``
goes first on ``PYTHONPATH`` and the settings travel in :data:`SETTINGS_VAR`, so every Python
process the launcher starts activates opdvfs by itself (:func:`activate_from_env`).
"""

from __future__ import annotations

import atexit
import builtins
import faulthandler
import importlib.machinery
import importlib.util
import json
import os
import re
import runpy
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from opdvfs.exceptions import CaptureError, ValidationError

__all__ = [
    "BOOT_DIR",
    "SETTINGS_VAR",
    "PythonCommand",
    "activate_from_env",
    "activation_env",
    "is_python",
    "parse_python_command",
    "run_python",
]

#: The folder whose ``sitecustomize.py`` activates opdvfs in launched Python processes.
BOOT_DIR = Path(__file__).resolve().parent / "_boot"

#: The environment variable carrying a launched run's settings (one JSON object).
SETTINGS_VAR = "OPDVFS_SETTINGS"

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?t?(\.exe)?$")
#: Flags without an argument that take effect in a running interpreter (or change nothing).
_APPLIED_FLAGS = frozenset("uBPq")
#: Flags without an argument that only the interpreter's start can apply.
_START_ONLY_FLAGS = frozenset("bdEhiIORsSvVx")
#: ``-X`` options that only the interpreter's start can apply.
_START_ONLY_X = frozenset(
    {
        "importtime",
        "utf8",
        "frozen_modules",
        "no_debug_ranges",
        "perf",
        "showrefcount",
        "warn_default_encoding",
        "cpu_count",
        "presite",
        "gil",
        "pycache_prefix",
    }
)
_WARNING_ACTIONS = ("default", "error", "ignore", "always", "module", "once")


@dataclass(frozen=True)
class PythonCommand:
    """A ``python`` command line, parsed: what it runs and how.

    Attributes
    ----------
    kind
        ``"path"`` (a script, a folder or zip with ``__main__.py``), ``"module"`` (``-m``) or
        ``"code"`` (``-c``).
    target
        The script's path, the module's name or the code.
    args
        The arguments after it (``sys.argv[1:]`` of the program).
    flags
        The interpreter flags before it, one per item (``"-u"``, ``"-W", "error"`` as
        ``"-Werror"``, ``"-Xdev"``).
    """

    kind: Literal["path", "module", "code"]
    target: str
    args: tuple[str, ...] = ()
    flags: tuple[str, ...] = field(default=())


def is_python(program: str) -> bool:
    """Return whether ``program`` (``argv[0]`` of a command) names a Python interpreter."""
    return bool(_PYTHON_NAME.match(Path(program).name)) or program == sys.executable


def parse_python_command(argv: Sequence[str]) -> PythonCommand | None:
    """Parse ``python [FLAGS] (SCRIPT | -m MODULE | -c CODE) ARGS`` (or ``SCRIPT.py ARGS``).

    Parameters
    ----------
    argv
        The command after ``--``.

    Returns
    -------
    PythonCommand or None
        None when the program is not Python (a launcher: run it with :func:`activation_env`).

    Raises
    ------
    ValidationError
        For an empty command, a missing script, a flag this process cannot apply (the message
        says to start opdvfs with it instead) or a malformed ``-W``/``-X`` value.
    """
    if not argv:
        raise ValidationError("give the program after --, e.g. -- python train.py", field="argv")
    if not is_python(argv[0]):
        if argv[0].endswith(".py"):  # `-- train.py ARGS`: the script itself
            return _checked(PythonCommand("path", argv[0], tuple(argv[1:])))
        return None
    flags: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        letters = arg[1:]
        while letters:
            letter, rest = letters[0], letters[1:]
            if letter in "WXcm":
                value = rest
                if not value:
                    i += 1
                    if i >= len(argv):
                        raise ValidationError(
                            f"python option -{letter} needs a value", field="argv"
                        )
                    value = argv[i]
                if letter in "cm":
                    kind: Literal["module", "code"] = "module" if letter == "m" else "code"
                    return _checked(PythonCommand(kind, value, tuple(argv[i + 1 :]), tuple(flags)))
                flags.append(f"-{letter}{value}")
                break
            if letter in _START_ONLY_FLAGS or letter not in _APPLIED_FLAGS:
                raise _start_only(f"-{letter}")
            flags.append(f"-{letter}")
            letters = rest
        i += 1
    if i >= len(argv):
        raise ValidationError(
            "give the script after python, e.g. -- python train.py (or -m MODULE)", field="argv"
        )
    if argv[i] == "-":
        raise ValidationError("a script read from stdin cannot be run under opdvfs", field="argv")
    return _checked(PythonCommand("path", argv[i], tuple(argv[i + 1 :]), tuple(flags)))


def _checked(command: PythonCommand) -> PythonCommand:
    if command.kind == "path" and not Path(command.target).exists():
        raise ValidationError(f"{command.target}: no such script", field="argv")
    if command.kind == "module":
        # -m looks in the working folder first; only the top-level package is looked up, so
        # nothing of the program is imported before it starts
        top = command.target.partition(".")[0]
        here = importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path[1:]])
        # importlib.util also asks builtins, frozen modules and meta-path finders
        if here is None and importlib.util.find_spec(top) is None:
            raise ValidationError(
                f"-m {command.target}: no module named {top!r} in {os.getcwd()} or on sys.path",
                field="argv",
            )
    for flag in command.flags:  # a bad -W/-X value is an error before the program starts
        if flag.startswith("-W"):
            _warning_filter(flag[2:])
        elif flag.startswith("-X") and flag[2:].split("=")[0] in _START_ONLY_X:
            raise _start_only(f"-X {flag[2:]}")
    return command


def _start_only(flag: str) -> ValidationError:
    return ValidationError(
        f"python {flag} takes effect only when an interpreter starts; start opdvfs with it "
        f"instead: python {flag} -m opdvfs ...",
        field="argv",
    )


def _warning_filter(option: str) -> tuple[str, str, type[Warning], str, int]:
    """Parse a ``-W action:message:category:module:lineno`` value as CPython does."""
    parts = [p.strip() for p in option.split(":")]
    if len(parts) > 5:
        raise ValidationError(f"python -W {option}: too many fields", field="argv")
    action, message, category_name, module, lineno = (parts + [""] * 5)[:5]
    actions = [a for a in _WARNING_ACTIONS if action and a.startswith(action)] or (
        ["default"] if not action else []
    )
    if len(actions) != 1:
        raise ValidationError(
            f"python -W {option}: action {action!r} is not one of {', '.join(_WARNING_ACTIONS)}",
            field="argv",
        )
    category: Any = Warning
    if category_name:
        module_name, _, name = category_name.rpartition(".")
        try:
            owner = __import__(module_name, fromlist=[name]) if module_name else builtins
            category = getattr(owner, name)
        except (ImportError, AttributeError):
            category = None
        if not (isinstance(category, type) and issubclass(category, Warning)):
            raise ValidationError(
                f"python -W {option}: {category_name!r} is not a warning category", field="argv"
            )
    if lineno and not lineno.isdigit():
        raise ValidationError(f"python -W {option}: line {lineno!r} is not a number", field="argv")
    escaped_module = re.escape(module) + r"\Z" if module else ""
    return actions[0], re.escape(message), category, escaped_module, int(lineno or 0)


@contextmanager
def _python_flags(flags: Sequence[str]) -> Iterator[bool]:
    """Apply ``flags`` for the block (warning filters and bytecode writing are put back).

    Yields whether the script's folder goes on ``sys.path`` (not under ``-P``).
    """
    saved_bytecode = sys.dont_write_bytecode
    saved_warnoptions = list(sys.warnoptions)
    saved_x = dict(sys._xoptions)
    with warnings.catch_warnings():
        safe_path = bool(sys.flags.safe_path)
        for flag in flags:
            letter, value = flag[1], flag[2:]
            if letter == "u":
                for stream in (sys.stdout, sys.stderr):
                    reconfigure = getattr(stream, "reconfigure", None)
                    if reconfigure is not None:
                        reconfigure(write_through=True)
            elif letter == "B":
                sys.dont_write_bytecode = True
            elif letter == "P":
                safe_path = True
            elif letter == "W":
                action, message, category, module, lineno = _warning_filter(value)
                warnings.filterwarnings(action, message, category, module, lineno)  # type: ignore[arg-type]
                sys.warnoptions.append(value)
            elif letter == "X":
                key, _, setting = value.partition("=")
                sys._xoptions[key] = setting or True
                if key in ("faulthandler", "dev"):
                    faulthandler.enable(file=sys.__stderr__ or sys.stderr)  # fd 2, as python
                if key == "dev":
                    warnings.simplefilter("default")
                if key == "tracemalloc":
                    import tracemalloc

                    tracemalloc.start(int(setting or 1))
                if key == "int_max_str_digits":
                    sys.set_int_max_str_digits(int(setting))
        try:
            yield not safe_path
        finally:
            sys.dont_write_bytecode = saved_bytecode
            sys.warnoptions[:] = saved_warnoptions
            sys._xoptions.clear()
            sys._xoptions.update(saved_x)


def run_python(command: PythonCommand) -> None:
    """Run ``command`` in this process as ``python`` would run it, as ``__main__``.

    ``sys.argv`` and ``sys.path[0]`` are set as CPython sets them (the script's real folder; the
    working folder for ``-m``; ``''`` for ``-c``) and put back afterwards. ``sys.exit(0)`` (or
    ``None``) from the program is a normal end; any other exit status propagates as
    ``SystemExit``.

    Parameters
    ----------
    command
        What to run (:func:`parse_python_command`).
    """
    saved_argv, saved_path = sys.argv, list(sys.path)
    try:
        with _python_flags(command.flags) as add_path:
            if add_path:
                entry = {
                    "path": os.path.dirname(os.path.realpath(command.target)),
                    "module": os.getcwd(),
                    "code": "",
                }[command.kind]
                # sys.path[0] is this interpreter's own entry (opdvfs's script folder, or the
                # working folder under -m opdvfs): the program's takes its place, as in CPython
                if sys.path and not sys.flags.safe_path:
                    sys.path[0] = entry
                else:
                    sys.path.insert(0, entry)
            if command.kind == "path":
                sys.argv = [command.target, *command.args]
                runpy.run_path(command.target, run_name="__main__")
            elif command.kind == "module":
                sys.argv = ["-m", *command.args]  # run_module puts the module's file first
                runpy.run_module(command.target, run_name="__main__", alter_sys=True)
            else:
                sys.argv = ["-c", *command.args]
                code = compile(command.target, "<string>", "exec")
                exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


# ------------------------------------------------------------------------- launched processes
def activation_env(settings: dict[str, Any], base: dict[str, str] | None = None) -> dict[str, str]:
    """Return the environment variables that make launched Python processes activate opdvfs.

    Parameters
    ----------
    settings
        The run's settings (JSON-serialisable): ``mode`` (``"run"`` or ``"capture"``) and the
        options of that command; :func:`activate_from_env` reads them in each process.
    base
        The environment the variables are added to (default: none; only the two variables).

    Returns
    -------
    dict of str to str
        ``PYTHONPATH`` with :data:`BOOT_DIR` first (any earlier value kept after it) and
        :data:`SETTINGS_VAR`.
    """
    env = dict(base) if base is not None else {}
    earlier = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "") if base is None else "")
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *([earlier] if earlier else [])])
    env[SETTINGS_VAR] = json.dumps(settings, separators=(",", ":"))
    return env


#: Programs that launch the training processes and run none of it themselves.
_LAUNCHERS = frozenset(
    {
        "torchrun",
        "torch.distributed.run",
        "torch.distributed.launch",
        "accelerate",
        "accelerate.commands.launch",
        "accelerate.commands.accelerate_cli",
        "deepspeed",
        "deepspeed.launcher.runner",
        "deepspeed.launcher.launch",
    }
)


def _is_launcher_process(argv: Sequence[str]) -> bool:
    """Whether this process (its original command line) is a launcher or a helper of one."""
    if "--multiprocessing-fork" in argv or any("multiprocessing" in a for a in argv[1:3]):
        return True
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1] in _LAUNCHERS
        if not arg.startswith("-"):
            return Path(arg).name in _LAUNCHERS
    return Path(argv[0]).name in _LAUNCHERS if argv else False


def activate_from_env() -> bool:
    """Activate opdvfs in a process started by a launcher (``sitecustomize`` calls this).

    Reads :data:`SETTINGS_VAR`; in a process that runs the user's program (not the launcher
    itself, nor a multiprocessing helper) it enters the recorder or the executor with its clock
    guard now and leaves them at interpreter exit, writing this rank's report for the parent.

    Returns
    -------
    bool
        Whether this process was activated.
    """
    text = os.environ.get(SETTINGS_VAR)
    if not text or _is_launcher_process(getattr(sys, "orig_argv", sys.argv)):
        return False
    settings = json.loads(text)
    os.environ.pop(SETTINGS_VAR, None)  # the program's own children are not activated again
    from opdvfs.exceptions import OpdvfsError
    from opdvfs.runtime.session import Session

    stack = ExitStack()
    try:
        session = Session.from_settings(settings)
        stack.enter_context(session)
    except OpdvfsError as exc:  # the parent checked first: this is rare (a rank's own file)
        print(f"opdvfs: error: {exc}", file=sys.stderr, flush=True)
        os._exit(2)

    def finish() -> None:
        stack.close()
        session.write_report()

    atexit.register(finish)
    return True


def report_dir() -> str:
    """Return a new folder for the launched processes' reports (removed by the caller)."""
    return tempfile.mkdtemp(prefix="opdvfs-run-")


def read_reports(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return the reports the launched processes wrote into ``folder``, rank 0 first.

    Raises
    ------
    CaptureError
        If no process wrote one (the launcher started no Python process opdvfs could activate).
    """
    reports = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    if not reports:
        raise CaptureError(
            "the launcher started no Python process that opdvfs could activate (is the "
            "launched Python the one opdvfs is installed in?)"
        )
    return sorted(reports, key=lambda r: (r.get("rank", 0), r.get("pid", 0)))
