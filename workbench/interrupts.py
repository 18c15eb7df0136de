"""Ctrl-C around the few writes and clean-ups that must not stop half-way."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

STOPPING_WAIT_S = 5.0
"""How long a write waits for a run store held by another process once a Ctrl-C has stopped the
work (instead of the store's ``wait_s``, 60 s by default): those last writes run with Ctrl-C held
back, and a minute of a command that ignores the key reads as a hang. A run whose last batch is
then not written keeps what was flushed before; once the process has ended it reads as
interrupted and resumes from there."""

_state = threading.local()


@contextlib.contextmanager
def stopping() -> Iterator[None]:
    """Mark this thread as stopping after a Ctrl-C while the block runs: run store waits are
    capped at :data:`STOPPING_WAIT_S` (see :func:`wait_cap`)."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def wait_cap() -> float | None:
    """The longest a run store write of this thread may wait now, or None for no cap."""
    return STOPPING_WAIT_S if getattr(_state, "depth", 0) else None


@contextlib.contextmanager
def ctrl_c_held_back() -> Iterator[None]:
    """Hold a Ctrl-C back while the block runs, and deliver it just after.

    A key held down (or pressed twice) sends SIGINT again while an interrupted run writes its last
    batch, or while an experiment ends its worker processes and records that it was interrupted:
    the write was stopped half-way (a run not yet flushed was lost whole) and the workers were
    left running. Only the main thread can set signal handlers: elsewhere (the app's script
    thread) this does nothing, as it does where SIGINT is ignored (an experiment's workers)."""
    import signal

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)
