"""A Ctrl-C held back around writes and clean-ups that must not stop half-way."""

from __future__ import annotations

import signal
import threading

import pytest

from workbench.interrupts import ctrl_c_held_back


def test_a_ctrl_c_inside_the_block_is_delivered_after_it() -> None:
    finished = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with ctrl_c_held_back():
                signal.raise_signal(signal.SIGINT)
                finished.append("the block ran to its end")
        assert finished == ["the block ran to its end"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_no_ctrl_c_means_nothing_is_raised_and_the_handler_is_put_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c_held_back():
        pass
    assert signal.getsignal(signal.SIGINT) is before


def test_where_ctrl_c_is_ignored_it_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with ctrl_c_held_back():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_it_does_nothing() -> None:
    """The app runs scripts in a thread, where signal handlers cannot be set (it raised there)."""
    errors = []

    def run() -> None:
        try:
            with ctrl_c_held_back():
                pass
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors == []


def _restoring_sigint(test):
    """Run ``test`` and put the SIGINT handler back (the CLI leaves Ctrl-C ignored after one)."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        test()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_cli_finishes_its_clean_up_through_a_second_ctrl_c() -> None:
    """The first Ctrl-C cancels the work; one pressed during its clean-up (recording what was done,
    ending the workers) is ignored. asyncio's own handler raised KeyboardInterrupt there, so the
    clean-up stopped half-way."""
    import asyncio

    from workbench.cli import _run_async

    cleaned = []

    async def work() -> None:
        signal.raise_signal(signal.SIGINT)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            signal.raise_signal(signal.SIGINT)  # the key is still down
            await asyncio.sleep(0)
            cleaned.append("the clean-up ran to its end")
            raise

    def test() -> None:
        with pytest.raises(KeyboardInterrupt):
            _run_async(work())
        assert cleaned == ["the clean-up ran to its end"]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # until the command has said what it kept

    _restoring_sigint(test)


def test_a_ctrl_c_is_not_lost_while_the_work_does_not_yield() -> None:
    """Work that collects results without yielding to the loop still stops at the first Ctrl-C
    (a cancel scheduled on the loop waited for it, so an experiment ran to its end)."""
    from workbench.cli import _run_async

    async def work() -> str:
        signal.raise_signal(signal.SIGINT)
        return "done"  # (no suspension before the end: its results were at hand)

    def test() -> None:
        with pytest.raises(KeyboardInterrupt):
            _run_async(work())

    _restoring_sigint(test)


def test_an_experiment_stops_writing_finished_runs_at_the_first_ctrl_c() -> None:
    """Runs that finished together are written one by one; a Ctrl-C during one of those writes
    stops the experiment after that write, and the runs not written stay pending for the clean-up
    to drop (a resume replays them). The loop never yielded between writes, so the cancel waited
    until every finished run, up to the experiment's last, had been written."""
    import asyncio

    from workbench.cli import _run_async
    from workbench.experiments import _collect

    written: list[str] = []
    left: dict = {}

    def write(payload: dict, task: str) -> None:
        written.append(task)
        if len(written) == 1:
            signal.raise_signal(signal.SIGINT)  # pressed while the first run is being written

    async def work() -> None:
        loop = asyncio.get_running_loop()
        pending = {}
        for name in ("a", "b", "c", "d"):
            future = loop.create_future()
            future.set_result({"run": name})
            pending[future] = name  # all four finished at once: one batch
        left["pending"] = pending
        await _collect(pending, write)

    def test() -> None:
        with pytest.raises(KeyboardInterrupt):
            _run_async(work())
        assert len(written) == 1
        assert sorted(left["pending"].values()) == sorted({"a", "b", "c", "d"} - set(written))

    _restoring_sigint(test)


def test_without_a_ctrl_c_the_result_comes_back_and_the_handler_is_put_back() -> None:
    import asyncio

    from workbench.cli import _run_async

    async def work() -> str:
        await asyncio.sleep(0)
        return "done"

    before = signal.getsignal(signal.SIGINT)
    assert _run_async(work()) == "done"
    assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_during_a_wait_for_a_held_run_store_shortens_that_wait(tmp_path, monkeypatch) -> None:
    """The likeliest moment for a Ctrl-C is just after "waiting for …": the wait's limit was read
    once, at its start, so the command still waited the whole of it with the key ignored."""
    from conftest import held_by_another_process

    from workbench import interrupts
    from workbench.cli import _run_async
    from workbench.runstore import RunStore, RunStoreLocked

    monkeypatch.setattr(interrupts, "STOPPING_WAIT_S", 0.3)
    db = tmp_path / "w.duckdb"
    RunStore(db).runs()  # (the file exists)
    waits: list[str] = []

    def on_wait(message: str) -> None:
        waits.append(message)
        signal.raise_signal(signal.SIGINT)  # pressed as the wait starts

    store = RunStore(db, wait_s=5, on_wait=on_wait)

    async def work() -> object:
        return store.runs()

    def test() -> None:
        with held_by_another_process(db), pytest.raises(RunStoreLocked, match=r"busy for 0\.3 s"):
            _run_async(work())
        assert waits == [f"waiting for {db}: another process is using it (up to 5 s)"]

    _restoring_sigint(test)


def test_called_from_code_the_handler_in_place_is_put_back_after_a_ctrl_c_message() -> None:
    """Reached without an interrupted ``_run_async`` before it, ``_exit_interrupted`` put back
    Python's default handler (or an earlier call's stale one) instead of the caller's own."""
    from workbench.cli import _exit_interrupted

    def own(signum, frame) -> None:
        pass

    def test() -> None:
        signal.signal(signal.SIGINT, own)
        with pytest.raises(SystemExit) as stopped:
            _exit_interrupted("interrupted")
        assert stopped.value.code == 130 and signal.getsignal(signal.SIGINT) is own

    _restoring_sigint(test)
