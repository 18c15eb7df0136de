"""Experiments the app runs in a thread of its own process, not in a page's script.

Streamlit stops a page's script when its user opens another page or closes the tab: an experiment
run there stopped with it (recorded interrupted, to resume). Started here, it goes on whatever the
browser does; any page of any session follows it from :func:`job` and can :func:`stop` it. When
the server stops, Python's exit stops every running one first (as Stop does: recorded interrupted,
its worker processes ended; without that, the exit waited for a process pool's queued runs, minutes),
for at most :data:`EXIT_WAIT_S`; a server killed outright leaves it to the run store, which finds
its owner process gone and records it interrupted. No Streamlit import: tested without it.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import WorkbenchError

log = logging.getLogger(__name__)


class AlreadyRunning(WorkbenchError):
    """The experiment is already running in this process."""


@dataclass
class Job:
    """One experiment running (or run) in a thread of this process."""

    experiment_id: str
    progress: Any = None  # the latest ``experiments.Progress``
    outcome: Any = None  # the ``ExperimentOutcome`` once it ended normally
    error: str | None = None  # why it stopped otherwise (refused, interrupted, failed)
    stop_asked: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


_JOBS: dict[str, Job] = {}
_LOCK = threading.RLock()
EXIT_WAIT_S = 10.0  # how long the process's exit waits for its running experiments to stop
_exit_hook: list[bool] = []


def job(experiment_id: str) -> Job | None:
    """The experiment's job in this process (running or ended), else ``None``."""
    with _LOCK:
        return _JOBS.get(experiment_id)


def running() -> list[str]:
    """The experiments running in this process now."""
    with _LOCK:
        return [key for key, value in _JOBS.items() if value.alive]


def start(store: Any, experiment_id: str) -> Job:
    """Run (or resume) ``experiment_id`` in a new thread, writing to ``store``; refused while it
    already runs here (two runs of one experiment would replay the same pairs)."""
    with _LOCK:
        if not _exit_hook:  # (registered after concurrent.futures' own: run before it, which waits for the pools)
            getattr(threading, "_register_atexit", atexit.register)(_stop_all)
            _exit_hook.append(True)
        previous = _JOBS.get(experiment_id)
        if previous is not None and previous.alive:
            raise AlreadyRunning(f"experiment {experiment_id} is already running here")
        started = Job(experiment_id)
        started.thread = threading.Thread(target=_run, args=(started, store), daemon=True,
                                          name=f"omem experiment {experiment_id}")
        _JOBS[experiment_id] = started
        started.thread.start()
    return started


def stop(experiment_id: str) -> bool:
    """Ask a running experiment to stop (it is recorded interrupted, what it finished kept);
    ``False`` when it is not running here."""
    with _LOCK:
        found = _JOBS.get(experiment_id)
        if found is None or not found.alive:
            return False
        found.stop_asked = True
        loop, task = found._loop, found._task
    if loop is not None and task is not None:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # (its loop closed just now: it ended)
            pass
    return True


def wait(experiment_id: str, timeout: float | None = None) -> Job | None:
    """Wait for the experiment's thread to end (at most ``timeout`` seconds); its job."""
    found = job(experiment_id)
    if found is not None and found.thread is not None:
        found.thread.join(timeout)
    return found


def delete(store: Any, experiment_id: str) -> None:
    """Delete the experiment from ``store``, refused while it runs here; under the lock
    :func:`start` takes, so a Start or Resume in another session cannot slip in between."""
    with _LOCK:
        found = _JOBS.get(experiment_id)
        if found is not None and found.alive:
            raise AlreadyRunning(f"experiment {experiment_id} is running here: stop it first")
        store.delete_experiment(experiment_id)
        _JOBS.pop(experiment_id, None)


def _stop_all() -> None:
    """At the process's exit: stop every running experiment and wait (bounded) for it to record
    that it stopped."""
    for experiment_id in running():
        stop(experiment_id)
    deadline = time.monotonic() + EXIT_WAIT_S
    for experiment_id in running():
        wait(experiment_id, max(0.0, deadline - time.monotonic()))


def _run(job: Job, store: Any) -> None:
    from .experiments import run_experiment

    def progress(p: Any) -> None:
        job.progress = p

    async def main() -> Any:
        with _LOCK:
            job._loop, job._task = asyncio.get_running_loop(), asyncio.current_task()
            if job.stop_asked:  # (asked before the loop existed)
                raise asyncio.CancelledError
        return await run_experiment(store, job.experiment_id, progress=progress)

    try:
        job.outcome = asyncio.run(main())
    except WorkbenchError as exc:  # refused (its dataset changed) or stopped by the run store
        job.error = f"The experiment stopped: {exc}"
    except (asyncio.CancelledError, KeyboardInterrupt):
        # (in the words of its status, "interrupted": "stopped" is the cost limit's)
        job.error = (f"Experiment {job.experiment_id} was interrupted by Stop: the runs it finished are kept, "
                     "and Resume finishes it.")
    except BaseException as exc:  # a bug: said on the page, its traceback in the server's log
        log.exception("experiment %s failed", job.experiment_id)
        job.error = f"The experiment failed: {type(exc).__name__}: {exc}"
