"""The workbench's errors: one root, so the CLI and the app catch what is ours and nothing else.

    WorkbenchError
     ├── RunStoreError            (runstore: cannot open, not a run store, read-only)
     │    └── RunStoreLocked      (another process kept the file busy too long)
     ├── ConfigurationError       (a replay that cannot start: unknown model, missing key, cache)
     └── ReplayFailed             (a compaction call failed mid-replay; carries the partial result)

``DatasetError`` (``workbench.datasets``) names file, record and field; it is a ``ValueError``.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Root of the workbench's own errors; ``str()`` is one sentence meant for a person."""


class ConfigurationError(WorkbenchError, ValueError):
    """A replay was rejected before it started (``run_id`` names the run recorded as failed)."""

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
