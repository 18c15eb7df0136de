"""The workbench's errors: one root, so the CLI and the app catch what is ours and nothing else.

    WorkbenchError
     ├── RunStoreError            (runstore: cannot open, not a run store, read-only)
     │    └── RunStoreLocked      (another process kept the file busy too long)
     ├── DatasetError             (workbench.datasets: names file, record, field; also a ValueError)
     ├── ConfigurationError       (a replay that cannot start: unknown model, missing key, a setting)
     ├── CacheUnavailable         (workbench.cache: the cache folder cannot be written)
     ├── ExperimentError          (workbench.experiments: an experiment that cannot start)
     ├── JudgeFailed              (workbench.judge: an answerer or judge call failed, reason cleaned)
     └── ReplayFailed             (a compaction call failed mid-replay; carries the partial result)
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Root of the workbench's own errors; ``str()`` is one sentence meant for a person."""


class ConfigurationError(WorkbenchError, ValueError):
    """A replay was rejected before it started (``run_id`` names the run recorded as failed)."""

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
