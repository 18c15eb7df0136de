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


REFUSED = "cannot be replayed"  # in a run's error: the library refused a message of the dataset


def stopped_by_dataset(error: object) -> bool:
    """Whether a run's recorded ``error`` says the library refused a message of its dataset (one
    dated behind what was already observed): a resume would stop at that message again."""
    return isinstance(error, str) and error.startswith("message ") and f" {REFUSED}: " in error
