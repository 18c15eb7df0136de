"""Ctrl-C around the few writes and clean-ups that must not stop half-way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def ctrl_c_held_back() -> Iterator[None]:
    """Hold a Ctrl-C back while the block runs, and deliver it just after.

    A key held down (or pressed twice) sends SIGINT again while an interrupted run writes its last
    batch, or while an experiment ends its worker processes and records that it was interrupted:
    the write was stopped half-way (a run not yet flushed was lost whole) and the workers were
    left running. Only the main thread can set signal handlers: elsewhere (the app's script
    thread) this does nothing, as it does where SIGINT is ignored (an experiment's workers)."""
    import signal
    import threading

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
