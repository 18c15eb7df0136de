"""Shared fixtures. Models are driven through litellm: a scripted custom provider registered in
``litellm.custom_provider_map`` for the test (the production call path, never a patch)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import omem_core  # first: it sets litellm's offline environment before litellm is imported
from omem_core import Message

import litellm  # noqa: E402  (after omem_core on purpose)
import pytest
from litellm import CustomLLM, ModelResponse
from pg import pg, pg_cluster  # noqa: F401  (a throwaway PostgreSQL server; skipped without it)

from workbench.catalog import shared_datasets_dir  # noqa: E402

SHARED_DATASETS = shared_datasets_dir()  # $OMEM_SHARED_DATASETS, else ../shared/datasets, as the workbench reads
SHARED_MISSING = (f"the shared datasets are absent ({SHARED_DATASETS}): real-data tests need them "
                  f"(put them at ../shared/datasets or point $OMEM_SHARED_DATASETS at them)")

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


def msg(i: int, content: str | None = None, *, thread: str = "t", role: str | None = None) -> Message:
    return Message(
        id=f"m{i}",
        thread_id=thread,
        role=role or ("user" if i % 2 == 0 else "assistant"),
        content=content if content is not None else f"message number {i}",
        created_at=T0 + timedelta(minutes=i),
    )


def ones(texts: list[str]) -> list[int]:
    """A counter that makes every message weigh 1: thresholds become message counts."""
    return [1] * len(texts)


Reply = str | BaseException | Callable[[list[dict[str, Any]]], str]


@dataclass
class Scripted(CustomLLM):
    """A litellm custom provider with a queue of replies and a log of calls.

    ``gate``: when set, each call waits for it (to hold a pass in flight); ``delay``: seconds
    each call sleeps. When the queue is empty, ``default`` answers.
    """

    replies: list[Reply] = field(default_factory=list)
    default: Reply = "- noted"
    delay: float = 0.0
    gate: asyncio.Event | None = None
    calls: list[list[dict[str, Any]]] = field(default_factory=list)
    started: int = 0
    cancelled: int = 0

    def __post_init__(self) -> None:
        CustomLLM.__init__(self)

    def _reply(self, messages: list[dict[str, Any]]) -> str:
        reply = self.replies.pop(0) if self.replies else self.default
        if isinstance(reply, BaseException):
            raise reply
        return reply(messages) if callable(reply) else reply

    async def acompletion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        self.started += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.calls.append(messages)
        return self._response(messages)

    def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        self.calls.append(messages)
        return self._response(messages)

    def _response(self, messages: list[dict[str, Any]]) -> ModelResponse:
        text = self._reply(messages)
        response = ModelResponse(choices=[{"message": {"role": "assistant", "content": text}}])
        response.usage = litellm.Usage(prompt_tokens=11, completion_tokens=7, total_tokens=18)  # type: ignore[attr-defined]
        return response


@contextlib.contextmanager
def scripted_provider() -> Iterator[Scripted]:
    """Register a fresh scripted model as ``scripted/model`` for the duration (then unregister)."""
    handler = Scripted()
    entry = {"provider": "scripted", "custom_handler": handler}
    litellm.custom_provider_map.append(entry)
    litellm.utils.custom_llm_setup()
    try:
        yield handler
    finally:
        litellm.custom_provider_map.remove(entry)
        if not any(e["provider"] == "scripted" for e in litellm.custom_provider_map):
            # litellm keeps a registered provider routable after its entry goes: forget it too, so a
            # test that names scripted/model without asking for it fails in every order, not only
            # when it happens to run first (CI once failed on exactly that).
            for known in (litellm.provider_list, getattr(litellm, "_custom_providers", [])):
                while "scripted" in known:
                    known.remove("scripted")


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    """A fresh scripted model reachable as ``scripted/model``."""
    with scripted_provider() as handler:
        yield handler


@contextlib.contextmanager
def priced_scripted_model():
    """``scripted/priced``: the scripted provider at a price litellm knows ($1 / $2 per 1k tokens)."""
    import litellm

    litellm.register_model({"scripted/priced": {"input_cost_per_token": 1e-3, "output_cost_per_token": 2e-3,
                                                "litellm_provider": "scripted", "mode": "chat"}})
    try:
        yield "scripted/priced"
    finally:
        litellm.model_cost.pop("scripted/priced", None)


@contextlib.contextmanager
def held_by_another_process(path: Path) -> Iterator[None]:
    """Keep the DuckDB file ``path`` open read-write in a separate process while inside."""
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(path)!r}); "
                                                     "print('ready', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        yield
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def db(tmp_path, monkeypatch) -> Iterator[Path]:
    """A fresh run store (and model cache) for the app under test: ``$OMEM_DB`` points at it."""
    path = tmp_path / "app.duckdb"
    monkeypatch.setenv("OMEM_DB", str(path))
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))
    yield path
    from workbench import background  # an experiment the app left running ends with its test

    for experiment_id in background.running():
        background.stop(experiment_id)
        background.wait(experiment_id, 60)


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip(SHARED_MISSING)
    return SHARED_DATASETS


__all__ = ["Scripted", "msg", "ones", "omem_core"]


def run_together(action: Callable[[], object], workers: int = 8) -> list[str]:
    """Fork ``workers`` processes that all run ``action`` at the same moment (behind a barrier):
    what each reported, ``"ok"`` or the ``repr`` of its exception. For races on first use."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(workers), context.Queue()

    def worker() -> None:
        barrier.wait()
        try:
            action()
            results.put("ok")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results.put(repr(exc))

    processes = [context.Process(target=worker) for _ in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    return [results.get(timeout=5) for _ in processes]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    """The shuffled order's seed, at the end and even under ``-q`` (which hides pytest-randomly's
    header line), so a failure that depends on the order can be repeated."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"test order shuffled with seed {seed}: repeat it with "
                                    f"python -m pytest -q --randomly-seed={seed}")
