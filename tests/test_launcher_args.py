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


@pytest.mark.parametrize(
    ("mode", "argv", "user", "expected"),
    [
        ("always defer defer+madvise [madvise] never", ["opdvfs", "plan", "p.parquet"], None, "0"),
        ("[always] defer defer+madvise madvise never", ["opdvfs", "fit", "p.parquet"], None, "0"),
        ("always defer [defer+madvise] madvise never", ["opdvfs", "plan", "p.parquet"], None, None),
        ("always defer defer+madvise [madvise] never", ["opdvfs", "run", "train.py"], None, None),
        ("always defer defer+madvise [madvise] never", ["opdvfs", "--help"], None, None),
        ("always defer defer+madvise [madvise] never", ["opdvfs", "plan", "p.parquet"], "1", "1"),
    ],
)
def test_table_commands_ask_numpy_for_small_pages(
    tmp_path, monkeypatch, mode, argv, user, expected
):
    """Where each hugepage fault compacts memory, only table commands turn numpy's advice off."""
    import opdvfs.cli as cli

    defrag = tmp_path / "defrag"
    defrag.write_text(mode + "\n")
    monkeypatch.setattr(cli, "_THP_DEFRAG", str(defrag))
    if user is None:
        monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    else:
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", user)
    cli._small_pages_for_numpy(argv)
    assert os.environ.get("NUMPY_MADVISE_HUGEPAGE") == expected  # monkeypatch restores it
