"""Property-based tests of the wrapper against a simple reference model (hypothesis).

Random interleavings of saves, cursorless reads, paging reads, deletes, model failures and
restarts, on the in-memory and the SQLite adapters. After every operation:

* no message is lost or altered (the inner store equals the reference list);
* observation coverage is a prefix of the thread; every record's sources exist;
* a read makes at most one observer and one reflector call; a paging read makes none;
* the rendered system message is exactly the newest reflection, then the unreflected
  observations oldest first.
"""

from __future__ import annotations

import asyncio
import tempfile
from datetime import timedelta
from pathlib import Path

from conftest import T0, ones, scripted_provider
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omem_core import (
    CompactionError,
    CompactionEvent,
    InMemoryMemoryStore,
    Message,
    create_in_memory_observation_store,
    create_observational_memory_store,
)
from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore

SAVE = st.tuples(st.just("save"), st.integers(1, 6))
READ = st.tuples(st.just("read"), st.integers(1, 5))
OPS = st.one_of(  # saves and reads weigh more, so passes and reflections happen often
    SAVE, SAVE, READ, READ, READ,
    st.tuples(st.just("page"), st.integers(0, 40), st.integers(1, 5)),
    st.tuples(st.just("delete")),
    st.tuples(st.just("fail")),
    st.tuples(st.just("restart"), st.booleans()),
)


def check_invariants(reference: list[Message], stored: list[Message], records, memory: Message | None,
                     *, rendered: bool) -> None:
    """``rendered``: ``memory`` is what a successful cursorless read returned ahead of its window."""
    assert stored == reference, "a message was lost or altered"
    ids = [m.id for m in reference]
    observations = [r for r in records if r.kind == "observation"]
    covered = [i for r in observations for i in r.source_ids]
    assert covered == ids[: len(covered)], "observation coverage is not a prefix of the thread"
    observation_ids = {r.id for r in observations}
    for record in records:
        if record.kind == "reflection":
            assert set(record.source_ids) <= observation_ids, "a reflection covers unknown observations"
    reflections = [r for r in records if r.kind == "reflection"]
    newest = reflections[-1] if reflections else None
    covered_by = set(newest.source_ids) if newest else set()
    expected = ([newest.text] if newest else []) + [r.text for r in observations if r.id not in covered_by]
    if not rendered:
        return
    if memory is not None:
        assert memory.role == "system" and memory.content == "\n\n".join(expected)
    else:
        assert not expected, "records exist but the read rendered no memory"


async def run_ops(ops, backend: str, folder: Path) -> None:
    def stores(fresh_records: bool, inner=None, observations=None):
        if backend == "sqlite":
            inner = inner or SQLiteMemoryStore(folder / "m.db")
            if fresh_records or observations is None:
                observations = SQLiteObservationStore(folder / f"o{len(list(folder.iterdir()))}.db")
        else:
            inner = inner or InMemoryMemoryStore()
            if fresh_records or observations is None:
                observations = create_in_memory_observation_store()
        return inner, observations

    with scripted_provider() as model:
        model.default = lambda messages: f"- note {len(model.calls)}"
        events: list[CompactionEvent] = []
        inner, observations = stores(True)

        def wrap():
            return create_observational_memory_store(
                inner, observer="scripted/model", reflector="scripted/model",
                thresholds={"observation": 3, "reflection": 3}, count_tokens=ones, observations=observations,
                on_event=events.append)

        store = wrap()
        reference: list[Message] = []
        counter = 0
        for op in ops:
            memory, got = None, None
            if op[0] == "save":
                batch = []
                for _ in range(op[1]):
                    batch.append(Message(id=f"m{counter}", thread_id="t", role="user" if counter % 2 else "assistant",
                                         content=f"message {counter} " * (counter % 4 + 1),
                                         created_at=T0 + timedelta(seconds=counter)))
                    counter += 1
                await store.save_messages(batch)
                reference.extend(batch)
            elif op[0] == "read":
                before = len(events)
                try:
                    got = await store.recall("t", last=op[1])
                except CompactionError:
                    got = None
                stages = [e.stage for e in events[before:]]
                assert stages.count("observe") <= 1 and stages.count("reflect") <= 1
                if got is not None:
                    window = got[1:] if got and got[0].role == "system" else got
                    assert window == reference[-op[1]:] if reference else window == []
                    memory = got[0] if got and got[0].role == "system" else None
            elif op[0] == "page":
                calls = model.started
                if op[1] < len(reference):
                    page = await store.recall("t", last=op[2], before=reference[op[1]].id)
                    assert page == reference[max(0, op[1] - op[2]) : op[1]]
                else:
                    try:
                        await store.recall("t", last=op[2], before="missing")
                        raise AssertionError("an unknown cursor must raise KeyError")
                    except KeyError:
                        pass
                assert model.started == calls, "a paging read called a model"
            elif op[0] == "delete":
                await store.delete_thread("t")
                reference.clear()
            elif op[0] == "fail":
                model.replies.append(RuntimeError("injected failure"))
            elif op[0] == "restart":
                inner, observations = stores(not op[1], inner, observations)
                store = wrap()
            records = await observations.list("t")
            stored = await inner.recall("t", last=10_000)
            check_invariants(reference, stored, records, memory, rendered=op[0] == "read" and got is not None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=10, max_size=60), backend=st.sampled_from(["memory", "sqlite"]))
def test_wrapper_matches_the_reference_model(ops, backend) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(run_ops(ops, backend, Path(folder)))
