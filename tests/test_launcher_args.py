"""A launcher's own arguments before opdvfs's command (deepspeed's ``--local_rank=N``)."""

import os
import subprocess
import sys

import pytest

from opdvfs.cli import strip_launcher_local_rank


@pytest.mark.parametrize(
    ("argv", "expected", "rank"),
    [
        (["opdvfs", "--local_rank=3", "tune", "-x"], ["opdvfs", "tune", "-x"], "3"),
        (["opdvfs", "--local-rank=0", "run", "s.json"], ["opdvfs", "run", "s.json"], "0"),
        (["opdvfs", "--local_rank", "1", "tune"], ["opdvfs", "tune"], "1"),
        # a script's own --local_rank, after the command, is the script's
        (["opdvfs", "tune", "--", "python", "t.py", "--local_rank=2"], None, None),
        (["opdvfs", "--local_rank", "tune"], None, None),  # no number: not a launcher's
        (["opdvfs"], None, None),
    ],
)
def test_a_launchers_leading_local_rank_is_taken_off(argv, expected, rank):
    args, local_rank = strip_launcher_local_rank(argv)
    assert args == (argv if expected is None else expected)
    assert local_rank == rank


def test_python_m_opdvfs_runs_as_deepspeed_starts_it(tmp_path):
    """``deepspeed --module opdvfs tune ...`` runs ``python -m opdvfs --local_rank=0 tune ...``."""
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    run = subprocess.run(
        [sys.executable, "-m", "opdvfs", "--local_rank=1", "doctor", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "No such option" not in run.stderr
