"""What a handler sees (re-exported from the runtime, where the per-run object lives)."""

from ._runtime.workflow.context import Context, JobInfo

__all__ = ["Context", "JobInfo"]
