"""Activate opdvfs in a Python process started by a launcher (``opdvfs run ... -- LAUNCHER``).

``opdvfs`` puts this folder first on ``PYTHONPATH``, so every Python process the launcher starts
imports this module at start-up. It first runs the ``sitecustomize`` this one hides (the
distribution's or the user's, found on the rest of ``sys.path``), then hands over to
:func:`opdvfs.runtime.launch.activate_from_env`, which does nothing unless ``OPDVFS_SETTINGS``
is set and this process runs the user's program.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # the hidden one is the sitecustomize from now on
    spec.loader.exec_module(module)


def _activate() -> None:
    if not os.environ.get("OPDVFS_SETTINGS"):
        return
    try:
        from opdvfs.runtime.launch import activate_from_env
    except ImportError as exc:  # a launched Python without opdvfs: say so, run unchanged
        print(f"opdvfs: not active in {sys.executable}: {exc}", file=sys.stderr)
        return
    activate_from_env()


_chain()
_activate()
