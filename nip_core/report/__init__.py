"""Reading a finished run back: the run reader, the HTML report, its plots and tree drawings."""

from nip_core.report.run_reader import RunView, read_run

__all__ = ["RunView", "read_run"]
