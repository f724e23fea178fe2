"""The guide's example script (docs/guide/tune.md) runs as it stands (needs torch)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).parent.parent / "examples" / "train_tiny_gpt.py"


@pytest.mark.slow  # a subprocess: the example as a user runs it
def test_the_tuned_example_trains():
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "3"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("trained 3 steps, last loss ")
