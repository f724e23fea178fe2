"""Planning: the ``Schedule`` data object (classification and solvers land here later)."""

from opdvfs.schedule import Schedule, Stage, Switch, op_signature

__all__ = ["Schedule", "Stage", "Switch", "op_signature"]
