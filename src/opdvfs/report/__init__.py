"""Reports: markdown tables and PNG figures of measured outcomes."""

from opdvfs.report.markdown import outcome_table, render

__all__ = ["outcome_table", "render"]
