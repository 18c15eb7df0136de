"""Faults during a replay: model errors at random steps, and a replay process killed with SIGKILL.

A deterministic scripted model (its reply is a function of its input) makes an interrupted and
resumed run comparable, record for record, with an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import Scripted

from workbench.catalog import DEMO_DATASET
from workbench.datasets import load_conversation
from workbench.replay import ReplayConfig, ReplayFailed, replay
from workbench.runstore import RunStore

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(reflector="scripted/model", observation_threshold=200, reflection_threshold=150, cache=False)


def note(messages) -> str:
    """A deterministic reply: the same input always gives the same note."""
    digest = hashlib.sha256(messages[-1]["content"].encode()).hexdigest()[:10]
    return f"- note {digest}"


def records_of(store: RunStore, run_id: str) -> list[tuple[str, str, str]]:
    frame = store.records(run_id)
    return list(zip(frame.kind, frame.source_ids, frame.text))


@pytest.fixture
def reference(scripted: Scripted, tmp_path) -> list[tuple[str, str, str]]:
    scripted.default = note
    with RunStore(tmp_path / "reference.duckdb") as store:
        result = asyncio.run(replay(load_conversation(DEMO_DATASET),
                                    ReplayConfig(observer="scripted/model", **CONFIG), store))
        return records_of(store, result.run_id)


@pytest.mark.parametrize("fail_at", [0, 3, 7, 12])
def test_a_model_error_at_any_pass_then_resume_matches_an_uninterrupted_run(
        scripted: Scripted, reference, tmp_path, fail_at: int) -> None:
    assert len(reference) > 12
    scripted.replies = [note] * fail_at + [RuntimeError(f"injected at call {fail_at}")]
    conversation = load_conversation(DEMO_DATASET)
    config = ReplayConfig(observer="scripted/model", **CONFIG)
    with RunStore(tmp_path / "faulty.duckdb") as store:
        with pytest.raises(ReplayFailed):
            asyncio.run(replay(conversation, config, store))
        run_id = store.runs().run_id[0]
        assert len(store.records(run_id)) == fail_at  # nothing partial
        scripted.replies = []
        asyncio.run(replay(conversation, config, store, resume=run_id))
        assert records_of(store, run_id) == reference
        assert list(store.steps(run_id).step) == list(range(100))


def test_a_timeout_fails_the_run_cleanly(scripted: Scripted, tmp_path) -> None:
    scripted.default = note
    scripted.delay = 0.5
    config = ReplayConfig(observer="scripted/model", timeout=0.05, **CONFIG)
    with RunStore(tmp_path / "slow.duckdb") as store:
        with pytest.raises(ReplayFailed, match="timed out"):
            asyncio.run(replay(load_conversation(DEMO_DATASET), config, store))
        run = store.runs().iloc[0]
        assert run.status == "failed" and "timed out" in run.error and store.records(run.run_id).empty


WORKER = textwrap.dedent('''
    import asyncio, hashlib, sys, time
    import omem_core, litellm
    from litellm import CustomLLM, ModelResponse
    from workbench.catalog import DEMO_DATASET
    from workbench.datasets import load_conversation
    from workbench.replay import ReplayConfig, replay
    from workbench.runstore import RunStore

    db, delay, resume = sys.argv[1], float(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else None)

    class Model(CustomLLM):
        async def acompletion(self, model, messages, *args, **kwargs):
            await asyncio.sleep(delay)
            digest = hashlib.sha256(messages[-1]["content"].encode()).hexdigest()[:10]
            r = ModelResponse(choices=[{"message": {"role": "assistant", "content": f"- note {digest}"}}])
            r.usage = litellm.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
            return r

    litellm.custom_provider_map.append({"provider": "scripted", "custom_handler": Model()})
    config = ReplayConfig(observer="scripted/model", reflector="scripted/model", observation_threshold=200,
                          reflection_threshold=150, cache=False)
    with RunStore(db) as store:
        def progress(done, total, _):
            print(f"progress {done}", flush=True)
        asyncio.run(replay(load_conversation(DEMO_DATASET), config, store, resume=resume, progress=progress,
                           flush_every=10))
    print("finished", flush=True)
''')


def test_sigkill_mid_run_then_resume(reference, tmp_path) -> None:
    db = tmp_path / "killed.duckdb"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    worker = subprocess.Popen([sys.executable, str(script), str(db), "0.15"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline:  # kill it in the middle of the conversation
        line = worker.stdout.readline()
        if line.startswith("progress") and int(line.split()[1]) >= 110:
            break
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    with RunStore(db) as store:  # the file opens; what was written is intact; the dead run says so
        run = store.runs().iloc[0]
        assert run.status == "interrupted" and "stopped after" in run.error and "--resume" in run.error
        kept = store.records(run.run_id)
        assert 0 < len(kept) < len(reference) and kept.record_id.is_unique
        steps = store.steps(run.run_id)
        assert list(steps.step) == list(range(len(steps)))
        run_id = run.run_id
    resumed = subprocess.run([sys.executable, str(script), str(db), "0", run_id], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with RunStore(db) as store:
        assert store.run(run_id)["status"] == "completed"
        assert records_of(store, run_id) == reference
        assert list(store.steps(run_id).step) == list(range(100))
