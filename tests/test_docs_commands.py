"""The commands the docs show still exist and take the options shown (README.md, docs/**/*.md).

A fenced ``console``, ``sh`` or ``bash`` block is checked when the line before it is a marker
(an HTML comment, invisible on the site and on GitHub):

- ``<!-- check: parse -->``: every ``opdvfs`` command in it (``$ ``-prompted lines in a console
  block, every line in a shell block; also after ``sudo``, ``cd DIR &&``, ``-m opdvfs`` and
  inside ``$(...)``) is resolved against the CLI without running: its subcommand must exist,
  every option it gives must be one of that subcommand's, and a value given to an option with a
  fixed set of choices must be one of them. Words after ``--`` are the user's program.
- ``<!-- check: run -->``: the same, then each command runs in a fresh folder (in-process, as
  the CLI tests do) and must exit 0: only for cheap commands.

Placeholders in brackets (``[--profile measured.parquet]``) count as given.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from opdvfs.cli import app
from opdvfs.datasets import dataset_path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"^<!-- check: (?P<mode>parse|run) -->\n```(?P<lang>console|sh|bash)\n(?P<body>.*?)^```",
    re.M | re.S,
)
SUBSTITUTION = re.compile(r"\$\((opdvfs [^)]*)\)")
DATASET = re.compile(r"\$\(python -m opdvfs\.datasets ([\w.-]+)\)")


@dataclass(frozen=True)
class Shown:
    """One opdvfs command shown in the docs."""

    where: str  # file:line
    mode: str  # parse | run
    argv: tuple[str, ...]  # after "opdvfs"


def _commands(line: str) -> list[list[str]]:
    """The opdvfs invocations on one shell line, each as its arguments after ``opdvfs``."""
    found = []
    for inner in SUBSTITUTION.findall(line):
        found.extend(_commands(inner))
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    segment: list[str] = []
    for token in [*tokens, ";"]:
        if token in {";", "&&", "||", "|", ">", ">>", "&"}:
            words = [w for w in segment if w != "sudo"]
            if words[:1] == ["opdvfs"]:
                found.append(words[1:])
            elif "-m" in words and words[words.index("-m") + 1 : words.index("-m") + 2] == [
                "opdvfs"
            ]:  # torchrun ... -m opdvfs tune ...
                found.append(words[words.index("-m") + 2 :])
            segment = []
        else:
            segment.append(token)
    return found


def shown_commands() -> list[Shown]:
    """Every command in a marked block of README.md and docs/."""
    shown = []
    for page in PAGES:
        text = page.read_text()
        for block in BLOCK.finditer(text):
            first = text.count("\n", 0, block.start("body")) + 1
            for offset, line in enumerate(block["body"].splitlines()):
                if block["lang"] == "console":
                    if not line.startswith("$ "):
                        continue  # output
                    line = line[2:]
                where = f"{page.relative_to(ROOT)}:{first + offset}"
                for argv in _commands(line):
                    shown.append(Shown(where, block["mode"], tuple(argv)))
    return shown


SHOWN = shown_commands()
CLI = get_command(app)


def _resolve(argv: tuple[str, ...]) -> tuple[Any, list[str]]:
    # duck-typed: typer >= 0.22 carries its own copy of click, older ones run on click
    command: Any = CLI
    args = list(argv)
    while hasattr(command, "list_commands"):
        assert args, "a command group without its subcommand"
        sub = command.get_command(
            command.make_context("opdvfs", ["--help"], resilient_parsing=True), args[0]
        )
        assert sub is not None, f"no command {args[0]!r}"
        command, args = sub, args[1:]
    return command, args


def _placeholder(value: str) -> bool:
    return bool(re.search(r"[A-Z|\[\]<>]|\.\.\.|…", value))


def _choices(param: Any) -> tuple[str, ...] | None:
    """An option's fixed values: a ``Literal`` annotation (typer), or a click ``Choice``."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        annotation = descriptor.annotation
        for arm in (annotation, *get_args(annotation)):  # Literal[...] | None too
            if get_origin(arm) is Literal:
                return tuple(str(a) for a in get_args(arm))
        return None
    return getattr(getattr(param, "type", None), "choices", None)


def check_parses(argv: tuple[str, ...]) -> None:
    """Assert the command and its options exist and fixed-choice values are among the choices."""
    command, args = _resolve(argv)
    options = {
        name: param
        for param in command.params
        if param.param_type_name == "option"
        for name in (*param.opts, *param.secondary_opts)
    }
    args = [a.strip("[]") for a in args]
    if "--" in args:
        args = args[: args.index("--")]  # the rest is the user's program
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("-") and len(word) > 1 and not re.match(r"-\d", word):
            name, _, inline = word.partition("=")
            if name == "--help":
                break
            assert name in options, f"opdvfs {command.name} has no option {name}"
            param = options[name]
            if not param.is_flag and not param.count:
                value = inline or (args[i + 1] if i + 1 < len(args) else "")
                choices = _choices(param)
                if choices and not _placeholder(value):
                    assert value in choices, f"{name} {value!r}: not one of {list(choices)}"
                i += 0 if inline else 1
        i += 1


def test_the_docs_mark_commands_for_checking():
    files = {s.where.split(":")[0] for s in SHOWN}
    assert len(SHOWN) >= 20 and {"README.md", "docs/guide/tune.md"} <= files
    assert any(s.mode == "run" for s in SHOWN)


@pytest.mark.parametrize("shown", SHOWN, ids=[f"{s.where} {' '.join(s.argv[:1])}" for s in SHOWN])
def test_a_shown_command_parses(shown: Shown):
    try:
        check_parses(shown.argv)
    except AssertionError as e:
        raise AssertionError(f"{shown.where}: opdvfs {' '.join(shown.argv)}: {e}") from None


RUN = [s for s in SHOWN if s.mode == "run"]


@pytest.mark.parametrize("shown", RUN, ids=[s.where for s in RUN])
def test_a_cheap_shown_command_runs(shown: Shown, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [DATASET.sub(lambda m: str(dataset_path(m[1])), a) for a in shown.argv]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 0, f"{shown.where}: opdvfs {' '.join(argv)}\n{done.output}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("nosuch",), "no command 'nosuch'"),
        (("plan", "p.parquet", "--no-such-option", "1"), "has no option --no-such-option"),
        (("demo", "--objective", "cheapest"), "not one of"),
        (("plan", "p.parquet", "--objective=cheapest"), "not one of"),
    ],
)
def test_the_check_catches_a_wrong_command(argv, message):
    with pytest.raises(AssertionError, match=message):
        check_parses(argv)


def test_commands_are_found_where_the_docs_put_them():
    line = "cd proj && sudo opdvfs tune --target 0.02 -- python train.py --steps 3  # a GPU"
    assert _commands(line) == [
        ["tune", "--target", "0.02", "--", "python", "train.py", "--steps", "3"]
    ]
    assert _commands("torchrun --nproc-per-node 8 -m opdvfs run s.json -- train.py") == [
        ["run", "s.json", "--", "train.py"]
    ]
    assert _commands('eval "$(opdvfs run s.json --print-env)"; deepspeed train.py') == [
        ["run", "s.json", "--print-env"]
    ]
