"""Errors raised by omem_core.

    Exception
     ├── CompactionError   an observer or reflector pass failed inside a read
     ├── ValueError        bad configuration (thresholds, models, counters), raised up front;
     │                     a message or read the stores refuse (a late or conflicting message,
     │                     a negative ``last``)
     └── TypeError         an argument of the wrong type: a path where a store goes, a
                           ``count_tokens`` that is not callable, a non-str message field or
                           ``thread_id``

``KeyError`` is raised by a paging read whose cursor id is unknown, as the spec requires.
"""

from __future__ import annotations

from typing import Literal

Stage = Literal["observe", "reflect"]


class CompactionError(Exception):
    """A compaction pass failed: model error, timeout, empty output (or invisible or control characters only),
    or output that is not valid Unicode.

    The pass saved nothing and no message was lost; the next cursorless read retries it.
    The original exception, if any, is chained as ``__cause__``.
    """

    def __init__(self, *, stage: Stage, model: str, thread_id: str, reason: str) -> None:
        self.stage = stage
        self.model = model
        self.thread_id = thread_id
        self.reason = reason
        super().__init__(
            f"{stage} pass failed for thread {thread_id!r} with model {model!r}: {reason}"
        )
