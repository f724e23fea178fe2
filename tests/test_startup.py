"""Start-up: the CLI's cheap commands import none of the heavy libraries (issue 17)."""

import json
import subprocess
import sys

import pytest

HEAVY = ("scipy", "pandas", "pyarrow", "matplotlib", "torch")

# Runs the CLI as the console script does, then reports which heavy packages got imported.
_PROBE = """
import json, sys
heavy_names = set(json.loads(sys.argv[2]))
sys.argv = ["opdvfs", *json.loads(sys.argv[1])]
from opdvfs.cli import main
try:
    main()
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & heavy_names)
sys.stderr.write("HEAVY=" + json.dumps(heavy) + "\\n")
"""


def heavy_imports(*args: str, names: tuple[str, ...] = HEAVY) -> list[str]:
    """Return which of the packages ``names`` ``opdvfs ARGS`` imports, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args), json.dumps(names)],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("HEAVY="))
    return json.loads(line.removeprefix("HEAVY="))


def test_version_imports_only_the_package_face():
    # `opdvfs --version` parses nothing: no CLI framework, no numpy, no command module
    light = ("typer", "rich", "click", "pydantic", "numpy", "msgspec", "highspy")
    assert heavy_imports("--version", names=HEAVY + light) == []
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv = ['opdvfs', '--version']\n"
         "from opdvfs.cli import main\nmain()\n"
         "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opdvfs'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    version, modules = done.stdout.splitlines()
    assert version.startswith("opdvfs ")
    assert modules == "['opdvfs', 'opdvfs._lazy', 'opdvfs.cli']"


@pytest.mark.parametrize(
    "args", [("--version",), ("--help",), ("formats",), ("schema", "profile"), ("fit", "--help")]
)
def test_cheap_commands_import_no_heavy_library(args):
    assert heavy_imports(*args) == []


def test_listings_import_neither_scipy_nor_matplotlib():
    # `workloads` builds every workload to count its ops (pandas); `devices` reads presets only
    assert heavy_imports("devices") == []
    assert not set(heavy_imports("workloads")) & {"scipy", "matplotlib", "torch"}
