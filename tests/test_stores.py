"""The ports' contract, run against every adapter (in-memory, SQLite, PostgreSQL), and the Memory facade."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import random
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

import pytest
from conftest import T0, msg

from omem_core import (
    InMemoryMemoryStore,
    Memory,
    MemoryStore,
    Message,
    ObservationRecord,
    ObservationStore,
    create_in_memory_observation_store,
    create_observational_memory_store,
)
from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore, schema_version


def _fresh(request, in_memory, sqlite, directory, prefix, kind):
    """A factory of fresh stores of the fixture's adapter (SQLite: a new file each time;
    PostgreSQL: a new schema each time, on the session's throwaway server)."""
    if request.param == "memory":
        return in_memory
    if request.param == "postgres":
        space = request.getfixturevalue("pg")
        return lambda: getattr(space.fresh(), kind)()
    paths = (directory / f"{prefix}{i}.db" for i in itertools.count())
    return lambda: sqlite(next(paths))


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_memory_store(request, tmp_path):
    return _fresh(request, InMemoryMemoryStore, SQLiteMemoryStore, tmp_path, "m", "memory")


@pytest.fixture(params=["memory", "sqlite", "postgres", "duckdb"])
def make_observation_store(request, tmp_path):
    if request.param == "duckdb":  # a new file each time, as SQLite's
        from omem_core.duckdb_store import DuckDBObservationStore

        paths = (tmp_path / f"o{i}.duckdb" for i in itertools.count())
        opened: list = []
        request.addfinalizer(lambda: [s.close() for s in opened])
        return lambda: opened.append(DuckDBObservationStore(next(paths))) or opened[-1]
    return _fresh(request, create_in_memory_observation_store, SQLiteObservationStore, tmp_path, "o",
                  "observations")


def test_message_is_frozen_and_validated() -> None:
    m = msg(1)
    with pytest.raises(AttributeError):
        m.content = "edited"  # type: ignore[misc]
    with pytest.raises(ValueError, match="timezone-aware"):
        Message(id="x", thread_id="t", role="user", content="", created_at=datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="role must be one of"):
        Message(id="x", thread_id="t", role="robot", content="", created_at=T0)


async def test_recall_newest_last_oldest_first_and_paging(make_memory_store) -> None:
    store = make_memory_store()
    assert isinstance(store, MemoryStore)
    await store.save_messages([msg(i) for i in range(10)])
    assert [m.id for m in await store.recall("t", last=3)] == ["m7", "m8", "m9"]
    assert [m.id for m in await store.recall("t", last=3, before="m7")] == ["m4", "m5", "m6"]
    assert [m.id for m in await store.recall("t", last=5, before="m2")] == ["m0", "m1"]
    assert await store.recall("t", last=5, before="m0") == []
    assert await store.recall("nobody", last=5) == []
    assert await store.recall("t", last=0) == []


async def test_unknown_cursor_raises_key_error(make_memory_store) -> None:
    store = make_memory_store()
    await store.save_messages([msg(0)])
    with pytest.raises(KeyError, match="m404"):
        await store.recall("t", last=3, before="m404")
    with pytest.raises(KeyError):
        await store.recall("other-thread", last=3, before="m0")


async def test_order_is_created_at_then_insertion(make_memory_store) -> None:
    store = make_memory_store()
    same = T0
    a = Message(id="a", thread_id="t", role="user", content="a", created_at=same)
    b = Message(id="b", thread_id="t", role="user", content="b", created_at=same)
    early = Message(id="early", thread_id="t", role="user", content="e", created_at=same - timedelta(hours=1))
    late = Message(id="late", thread_id="t", role="user", content="l", created_at=same + timedelta(hours=1))
    await store.save_messages([late, a])
    await store.save_messages([b, early])
    assert [m.id for m in await store.recall("t", last=10)] == ["early", "a", "b", "late"]
    assert [m.id for m in await store.recall("t", last=10, before="b")] == ["early", "a"]


async def test_random_insertion_order_matches_a_sort(make_memory_store) -> None:
    rng = random.Random(7)
    store = make_memory_store()
    messages = [
        Message(id=f"x{i}", thread_id="t", role="user", content=str(i),
                created_at=T0 + timedelta(seconds=rng.randrange(50)))
        for i in range(300)
    ]
    for m in messages:
        await store.save_messages([m])
    expected = [m.id for m in sorted(messages, key=lambda m: m.created_at)]  # stable: ties by insertion
    assert [m.id for m in await store.recall("t", last=1000)] == expected
    cursor = expected[150]
    assert [m.id for m in await store.recall("t", last=20, before=cursor)] == expected[130:150]


async def test_saving_an_id_twice(make_memory_store) -> None:
    store = make_memory_store()
    await store.save_messages([msg(0)])
    await store.save_messages([msg(0)])  # identical: a no-op
    assert len(await store.recall("t", last=10)) == 1
    with pytest.raises(ValueError, match="immutable"):
        await store.save_messages([msg(0, "changed")])


async def test_delete_thread_and_working_memory(make_memory_store) -> None:
    store = make_memory_store()
    await store.save_messages([msg(0), msg(1, thread="u")])
    await store.update_working_memory("t", "name: Ada")
    assert await store.get_working_memory("t") == "name: Ada"
    await store.delete_thread("t")
    assert await store.recall("t", last=5) == []
    assert await store.get_working_memory("t") is None
    assert len(await store.recall("u", last=5)) == 1


async def test_working_memory_is_checked_alike_in_every_store(make_memory_store) -> None:
    """An int was stored as it was in memory and raised AttributeError in PostgreSQL; a lone
    surrogate was stored in memory and raised UnicodeEncodeError in SQLite and PostgreSQL."""
    store = make_memory_store()
    await store.update_working_memory("t", "kept")
    with pytest.raises(TypeError, match="working memory of thread 't': text must be a str, got int"):
        await store.update_working_memory("t", 123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="working memory of thread 't': text is not valid Unicode"):
        await store.update_working_memory("t", "a\ud800")
    with pytest.raises(TypeError, match="working memory: thread_id must be a str"):
        await store.update_working_memory(7, "x")  # type: ignore[arg-type]
    assert await store.get_working_memory("t") == "kept"  # what was there is untouched


async def test_a_message_dated_with_nanoseconds_is_saved_again_as_the_same_message(make_memory_store) -> None:
    """A pandas Timestamp with nanoseconds was accepted, stored to the microsecond by SQLite and
    PostgreSQL, and saving the same message again (a retry) was refused as "other fields"."""
    import pandas as pd

    stamp = pd.Timestamp("2024-03-01 09:00:00.000001999", tz="UTC")
    message = Message(id="m1", thread_id="t", role="user", content="hi", created_at=stamp)
    assert type(message.created_at) is datetime and message.created_at.microsecond == 1
    store = make_memory_store()
    await store.save_messages([message])
    await store.save_messages([Message(id="m1", thread_id="t", role="user", content="hi", created_at=stamp)])
    [back] = await store.recall("t", last=5)
    assert back == message


async def test_memory_facade_defaults_and_working_memory() -> None:
    memory = Memory(last_messages=2)
    await memory.save_messages([msg(i) for i in range(5)])
    assert [m.id for m in await memory.recall("t")] == ["m3", "m4"]
    assert [m.id for m in await memory.recall("t", last=3, before="m4")] == ["m1", "m2", "m3"]
    await memory.update_working_memory("t", "x")
    assert await memory.get_working_memory("t") == "x"
    await memory.delete_thread("t")
    assert await memory.recall("t") == []
    with pytest.raises(ValueError, match="last_messages"):
        Memory(last_messages=0)


async def test_memory_without_working_memory_capability() -> None:
    class Bare:
        async def save_messages(self, messages): ...
        async def recall(self, thread_id, *, last, before=None): return []
        async def delete_thread(self, thread_id): ...

    memory = Memory(Bare())
    assert not memory.has_working_memory
    # SPEC: the facade has the working-memory methods "when the storage has them" (as the wrapper
    # does); they were always there and raised NotImplementedError
    assert not hasattr(memory, "get_working_memory") and not hasattr(memory, "update_working_memory")
    with pytest.raises(AttributeError, match="Bare has no working-memory capability"):
        await memory.get_working_memory("t")
    with pytest.raises(AttributeError, match="no attribute 'get_working_memry'"):
        memory.get_working_memry  # (any other name: the usual error)
    # Over a wrapper, the store that lacks it is named, and Python does not point at a private method
    wrapped = Memory(create_observational_memory_store(Bare(), observer="omem/extractive"))
    with pytest.raises(AttributeError) as raised:
        wrapped.update_working_memory
    assert str(raised.value).startswith("ObservationalMemoryStore over Bare has no working-memory capability")
    # (Python 3.11 adds its suggestion only when it prints an uncaught error)
    script = textwrap.dedent("""
        from omem_core import Memory, create_observational_memory_store
        class Bare:
            async def save_messages(self, messages): ...
            async def recall(self, thread_id, *, last, before=None): return []
            async def delete_thread(self, thread_id): ...
        Memory(create_observational_memory_store(Bare(), observer="omem/extractive")).update_working_memory
    """)
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True).stderr
    assert "has no working-memory capability" in shown and "'_" not in shown.splitlines()[-1], shown
    full = Memory(InMemoryMemoryStore())
    assert full.has_working_memory and hasattr(full, "get_working_memory")
    await full.update_working_memory("t", "prefers tea")
    assert await full.get_working_memory("t") == "prefers tea"


def expected_recent(records: list[ObservationRecord]) -> list[ObservationRecord]:
    """Reference for ``list_recent``: the observations older than the newest reflection that it does
    not cover, then the suffix from the newest reflection or the newest observation, whichever is
    older (the whole list without a reflection)."""
    reflections = [i for i, r in enumerate(records) if r.kind == "reflection"]
    if not reflections:
        return list(records)
    newest = reflections[-1]
    covered = set(records[newest].source_ids)
    start = min([newest] + [i for i, r in enumerate(records) if r.kind == "observation"][-1:])
    return [r for r in records[:start] if r.kind == "observation" and r.id not in covered] + records[start:]


def record(i: int, kind: str = "observation", sources: tuple[str, ...] = (), *, thread: str = "t") -> ObservationRecord:
    """Ids sort in the opposite order of creation (``r999`` first, then ``r998``…), so an adapter
    that orders by id instead of creation fails."""
    return ObservationRecord(id=f"r{999 - i}", thread_id=thread, resource_id=None,
                             created_at=T0 + timedelta(seconds=i), kind=kind,  # type: ignore[arg-type]
                             source_ids=sources or (f"m{i}",), text=f"note {i}")


async def test_observation_store_contract(make_observation_store) -> None:
    store = make_observation_store()
    assert isinstance(store, ObservationStore)
    for i in range(3):
        await store.save(record(i))
    assert [r.id for r in await store.list("t")] == ["r999", "r998", "r997"]  # creation order, not id order
    await store.save(record(1))  # the same id and sources again (a pass that ran twice): a no-op
    assert [r.id for r in await store.list("t")] == ["r999", "r998", "r997"]
    with pytest.raises(ValueError, match="never edited"):
        await store.save(record(1, sources=("m7",)))
    # An id names one record in the store, whichever adapter: SQLite and PostgreSQL refused it in
    # another thread ("with other sources", although they were the same), memory and DuckDB took it.
    with pytest.raises(ValueError, match="record id 'r998' is already used by a record of thread 't'"):
        await store.save(record(1, thread="u"))
    assert await store.list("u") == []
    await store.delete_by_thread("t")
    assert await store.list("t") == []
    await store.save(record(1, thread="u"))  # its thread deleted, the id is free
    assert [r.id for r in await store.list("u")] == ["r998"]


def random_records(rng: random.Random) -> list[ObservationRecord]:
    """Records as passes (and lease expiries) leave them: each reflection covers a random subset of
    the observations before it — usually all of them, sometimes leaving some out."""
    records: list[ObservationRecord] = []
    for i in range(rng.randrange(1, 15)):
        kind = "observation" if i == 0 else rng.choice(["observation", "observation", "reflection"])
        if kind == "reflection":
            observations = [r.id for r in records if r.kind == "observation"]
            keep = 1.0 if rng.random() < 0.5 else rng.random()
            records.append(record(i, kind, tuple(o for o in observations if rng.random() < keep) or ("m0",)))
        else:
            records.append(record(i, kind))
    return records


async def test_list_recent_is_the_documented_subsequence(make_observation_store) -> None:
    from omem_core.observations import RecentRecords

    rng = random.Random(3)
    for trial in range(80):
        store = make_observation_store()
        assert isinstance(store, RecentRecords)
        for r in random_records(rng):
            await store.save(r)
        full = await store.list("t")
        assert await store.list_recent("t") == expected_recent(full)


async def test_memory_is_the_same_from_list_and_list_recent(make_observation_store) -> None:
    """A reflection that leaves older observations uncovered (e.g. after a lease expiry) must not
    hide any of them when the wrapper reads only ``list_recent``."""
    from omem_core.planning import memory_text, view_of

    store = make_observation_store()
    for i in range(3):
        await store.save(record(i))
    await store.save(record(3, "reflection", ("r999",)))  # covers the first observation only
    full, recent = await store.list("t"), await store.list_recent("t")
    assert memory_text(view_of(recent)) == memory_text(view_of(full)) == "note 3\n\nnote 1\n\nnote 2"
    rng = random.Random(11)
    for trial in range(80):
        store = make_observation_store()
        for r in random_records(rng):
            await store.save(r)
        full, recent = await store.list("t"), await store.list_recent("t")
        assert view_of(recent) == view_of(full)


async def test_delete_epochs(make_observation_store) -> None:
    """A save checked against the epoch read before the delete saves nothing; the thread's next
    incarnation has a new epoch; other threads are untouched; nothing of a deleted thread stays."""
    from omem_core.observations import DeleteEpochs

    store = make_observation_store()
    assert isinstance(store, DeleteEpochs)
    first = await store.delete_epoch("t")
    assert await store.delete_epoch("t") == first  # reading does not change it
    other = await store.delete_epoch("u")
    assert await store.save_unless_deleted(record(0), first)
    await store.delete_by_thread("t")
    assert not await store.save_unless_deleted(record(1), first)  # a pass from before the delete
    assert await store.list("t") == []
    second = await store.delete_epoch("t")
    assert second != first
    assert not await store.save_unless_deleted(record(2), first)
    assert await store.save_unless_deleted(record(3), second)
    assert await store.save_unless_deleted(record(4, thread="u"), other)
    assert [r.id for r in await store.list("t")] == ["r996"]


async def test_records_round_trip_exactly(make_observation_store) -> None:
    store = make_observation_store()
    original = ObservationRecord(id="r", thread_id="t", resource_id="res", created_at=T0, kind="reflection",
                                 source_ids=("a", "b"), text="line one\nline two <b>")
    await store.save(original)
    assert await store.list("t") == [original]
    assert await store.list("other") == []


async def test_messages_round_trip_exactly(make_memory_store) -> None:
    from datetime import timezone as tz

    store = make_memory_store()
    plus_two = Message(id="x", thread_id="t", role="tool", content="ü <script>", resource_id="r",
                       created_at=datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=tz(timedelta(hours=2))))
    await store.save_messages([plus_two])
    [back] = await store.recall("t", last=1)
    assert back == plus_two and back.created_at.utcoffset() == timedelta(hours=2)


def test_sqlite_schema_is_versioned_and_reopens(tmp_path) -> None:
    from omem_core.sqlite import _MIGRATIONS

    path = tmp_path / "both.db"
    SQLiteMemoryStore(path).close()
    SQLiteObservationStore(path).close()  # same file, both ports
    assert schema_version(path) == len(_MIGRATIONS) == 3
    SQLiteMemoryStore(path).close()  # reopening migrates nothing twice
    assert schema_version(path) == 3


async def test_sqlite_upgrades_an_older_file(tmp_path) -> None:
    import sqlite3

    from omem_core.sqlite import _MIGRATIONS

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as con:  # a file written by schema version 1
        con.executescript(_MIGRATIONS[0] + "; PRAGMA user_version = 1;")
        con.execute("INSERT INTO omem_records (id, thread_id, created_at, kind, source_ids, text) "
                    "VALUES ('r1', 't', '2024-01-01T00:00:00+00:00', 'observation', '[\"m1\"]', 'kept')")
        for i, source in ((2, "m2"), (3, "m3")):
            con.execute("INSERT INTO omem_records (id, thread_id, created_at, kind, source_ids, text) "
                        f"VALUES ('r{i}', 't', '2024-01-01T00:00:00+00:00', 'observation', '[\"{source}\"]', 'o{i}')")
        con.execute("INSERT INTO omem_records (id, thread_id, created_at, kind, source_ids, text) "
                    "VALUES ('ref', 't', '2024-01-01T00:00:00+00:00', 'reflection', '[\"r1\", \"r3\"]', 'R')")
    store = SQLiteObservationStore(path)
    assert schema_version(path) == 3
    assert [r.text for r in await store.list("t")] == ["kept", "o2", "o3", "R"]
    assert [r.text for r in await store.list_recent("t")] == ["o2", "o3", "R"]  # r2 is not covered
    assert await store.try_lease("t", "me", 30)
    assert await store.save_unless_deleted(record(9), await store.delete_epoch("t"))


async def test_sqlite_persists_across_reopen(tmp_path) -> None:
    path = tmp_path / "p.db"
    first = SQLiteMemoryStore(path)
    await first.save_messages([msg(i) for i in range(5)])
    first.close()
    again = SQLiteMemoryStore(path)
    assert [m.id for m in await again.recall("t", last=2, before="m4")] == ["m2", "m3"]


async def test_order_does_not_follow_ids(make_memory_store) -> None:
    """Ids whose sort order is the reverse of creation: order is by time, then insertion."""
    store = make_memory_store()
    messages = [Message(id=f"z{999 - i}", thread_id="t", role="user", content=str(i),
                        created_at=T0 + timedelta(seconds=i // 2)) for i in range(20)]  # pairs share a time
    await store.save_messages(messages[:10])
    for m in messages[10:]:
        await store.save_messages([m])
    assert [m.id for m in await store.recall("t", last=5)] == [m.id for m in messages[15:]]
    assert [m.id for m in await store.recall("t", last=4, before="z987")] == [m.id for m in messages[8:12]]


@pytest.mark.parametrize("batch, said", [
    ([msg(5), msg(0, "changed")], "message 'm0' is already saved in thread 't' with other fields"),
    # within the batch: it said "already saved", of a batch that saved nothing (found by an integrator)
    ([msg(5), msg(6), Message(id="m5", thread_id="t", role="user", content="other", created_at=T0)],
     "message 'm5' is twice in this batch for thread 't', with other fields; nothing was saved"),
])
async def test_a_conflicting_batch_saves_nothing(make_memory_store, batch, said) -> None:
    store = make_memory_store()
    await store.save_messages([msg(0)])
    with pytest.raises(ValueError, match=re.escape(said)):
        await store.save_messages(batch)
    assert [m.id for m in await store.recall("t", last=10)] == ["m0"]
    await store.save_messages([msg(5), msg(5)])  # an identical duplicate in a batch is fine
    assert [m.id for m in await store.recall("t", last=10)] == ["m0", "m5"]


@pytest.mark.parametrize("field", ["content", "id", "thread_id", "resource_id"])
async def test_lone_surrogates_are_rejected_alike(make_memory_store, field) -> None:
    store = make_memory_store()
    values = {"id": "x", "thread_id": "t", "role": "user", "content": "ok", "created_at": T0, "resource_id": None}
    values[field] = "bad \ud800 text"
    with pytest.raises(ValueError, match=rf"{field} is not valid Unicode \(a lone surrogate"):
        await store.save_messages([msg(1), Message(**values)])
    assert await store.recall("t", last=10) == []  # nothing of the batch


async def test_a_record_with_a_lone_surrogate_is_rejected_alike(make_observation_store) -> None:
    store = make_observation_store()
    bad = ObservationRecord(id="r", thread_id="t", resource_id=None, created_at=T0, kind="observation",
                            source_ids=("m1",), text="note \udc80")
    with pytest.raises(ValueError, match="text is not valid Unicode"):
        await store.save(bad)
    assert await store.list("t") == []


def test_the_reflection_cache_keeps_long_reflections_within_its_bound() -> None:
    """The SQLite and PostgreSQL adapters share it: long reflections only, least recently used out
    first, bounded by the source ids held, and a deleted thread's entries dropped."""
    from omem_core import ObservationRecord
    from omem_core.observations import ReflectionCache

    def reflection(thread: str, sources: int) -> ObservationRecord:
        return ObservationRecord(id=f"r-{thread}-{sources}", thread_id=thread, resource_id=None, created_at=T0,
                                 kind="reflection", source_ids=tuple(f"o{i}" for i in range(sources)), text="x")

    cache = ReflectionCache(max_ids=1500)
    cache.keep(1, reflection("a", 10))  # short: cheap to decode, not kept
    cache.keep(2, reflection("a", 600))
    cache.keep(3, reflection("b", 600))
    assert 1 not in cache and cache.get(2) is not None  # 2 is now the most recently used
    cache.keep(4, reflection("c", 600))  # 1,800 ids > 1,500: the least recently used (3) goes
    assert 2 in cache and 3 not in cache and 4 in cache
    cache.forget_thread("a")
    assert 2 not in cache and cache.get(2) is None and 4 in cache
    cache.keep(5, reflection("d", 2000))  # larger than the whole bound: never kept
    assert 5 not in cache


def test_the_duckdb_store_without_its_driver_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    """A library user without the [duckdb] extra got a bare "No module named 'duckdb'"."""

    from omem_core.duckdb_store import DuckDBObservationStore

    monkeypatch.setitem(sys.modules, "duckdb", None)  # (import duckdb now fails, as without the package)
    with pytest.raises(ImportError, match=r"needs the duckdb package: pip install 'omem\[duckdb\]'"):
        DuckDBObservationStore(tmp_path / "notes.duckdb")
    assert not (tmp_path / "notes.duckdb").exists()


async def test_the_duckdb_observation_store_keeps_records_across_reopen(tmp_path) -> None:
    """The DuckDB adapter (the spec's "ships a DuckDB one"): records persist in the file, in
    creation order, and the wrapper runs on it end to end with the offline model."""
    from omem_core import InMemoryMemoryStore, create_observational_memory_store
    from omem_core.duckdb_store import DuckDBObservationStore

    path = tmp_path / "notes.duckdb"
    with DuckDBObservationStore(path) as store:
        for i in range(3):
            await store.save(record(i))
    with DuckDBObservationStore(path) as store:
        assert [r.id for r in await store.list("t")] == ["r999", "r998", "r997"]
        await store.delete_by_thread("t")
        memory = create_observational_memory_store(InMemoryMemoryStore(), observations=store,
                                                   observer="omem/extractive",
                                                   thresholds={"observation": 30, "reflection": 60})
        await memory.save_messages([msg(i, f"Message {i}: Priya booked a flight to Lisbon for May {i}.")
                                    for i in range(30)])
        for _ in range(6):
            got = await memory.recall("t", last=4)
        assert got[0].role == "system" and "Lisbon" in got[0].content
        written = await store.list("t")
    with DuckDBObservationStore(path) as store:
        assert await store.list("t") == written and {r.kind for r in written} >= {"observation"}


async def test_the_duckdb_observation_store_refuses_a_file_that_is_no_duckdb_database(tmp_path) -> None:
    """DuckDB 2 opens a JSON or CSV file as a database of views over it: the store took such a
    path, wrote its records to memory and lost them at close."""
    from omem_core.duckdb_store import DuckDBObservationStore

    path = tmp_path / "notes.json"
    path.write_text('[{"a": 1}]\n')
    with pytest.raises(ValueError, match="notes.json: it is not a DuckDB database"):
        DuckDBObservationStore(path)
    assert path.read_text() == '[{"a": 1}]\n' and [p.name for p in tmp_path.iterdir()] == ["notes.json"]


def test_the_duckdb_store_versions_its_schema_and_refuses_a_newer_one(tmp_path) -> None:
    """DuckDB record files carried no schema version (SQLite and PostgreSQL do): a future omem's file
    would have been read, and written, with this one's statements. A file from before the version
    (records only) is version 1 and keeps its records."""
    import duckdb

    from omem_core.duckdb_store import SCHEMA_VERSION, DuckDBObservationStore

    old = tmp_path / "old.duckdb"
    with DuckDBObservationStore(old) as store:
        asyncio.run(store.save(record(1)))
    with contextlib.closing(duckdb.connect(str(old))) as con:
        con.execute("DROP TABLE omem_schema")  # as written before the version existed
    with DuckDBObservationStore(old) as store:
        assert [r.id for r in asyncio.run(store.list("t"))] == [record(1).id]
    with contextlib.closing(duckdb.connect(str(old))) as con:
        assert con.execute("SELECT version FROM omem_schema").fetchall() == [(SCHEMA_VERSION,)]
        con.execute("UPDATE omem_schema SET version = ?", [SCHEMA_VERSION + 1])
    before = old.read_bytes()
    with pytest.raises(ValueError, match=rf"old.duckdb: its schema is version {SCHEMA_VERSION + 1}, written by a "
                                         r"newer omem .*the file was not changed"):
        DuckDBObservationStore(old)
    assert old.read_bytes() == before
    with contextlib.closing(duckdb.connect(str(old))) as con:  # (the refused store let the file go)
        assert con.execute("SELECT count(*) FROM omem_records").fetchone()[0] == 1


def test_a_path_or_other_object_where_a_store_goes_is_refused_up_front(tmp_path) -> None:
    """A path given as the store was accepted, then failed at the first save with
    "AttributeError: 'str' object has no attribute 'recall'"."""
    from omem_core import Memory, create_observational_memory_store

    with pytest.raises(TypeError, match=r"^inner must be a MemoryStore .*got str 'memory.db' \(for a SQLite file "
                                        r"use omem_core.sqlite.SQLiteMemoryStore\(path\)\)"):
        create_observational_memory_store("memory.db", observer="omem/extractive")
    with pytest.raises(TypeError, match=r"^storage must be a MemoryStore \(an object with delete_thread, recall, "
                                        r"save_messages\), got PosixPath"):
        Memory(storage=tmp_path / "memory.db")
    with pytest.raises(TypeError, match=r"^observations must be an ObservationStore .*got dict"):
        create_observational_memory_store(observer="omem/extractive", observations={})
    with pytest.raises(TypeError, match=r"^storage must be a MemoryStore instance, got the class SQLiteMemoryStore "
                                        r"itself: create one first, e.g. SQLiteMemoryStore\(...\)"):
        Memory(storage=SQLiteMemoryStore)  # the class has the methods, so it passed the check
    with pytest.raises(TypeError, match=r"^observations must be an ObservationStore instance, got the class"):
        create_observational_memory_store(observer="omem/extractive", observations=SQLiteObservationStore)
    # a class that is no store at all is not told to "create one first, e.g. dict(...)"
    with pytest.raises(TypeError, match=r"^storage must be a MemoryStore \(an object with delete_thread, recall, "
                                        r"save_messages\), got the class dict$"):
        Memory(storage=dict)
    store = SQLiteMemoryStore(tmp_path / "ok.db")  # the real thing still goes through
    Memory(storage=create_observational_memory_store(store, observer="omem/extractive",
                                                     observations=SQLiteObservationStore(tmp_path / "ok.db")))


def test_a_store_whose_methods_cannot_be_awaited_is_refused_up_front() -> None:
    """A store written with plain methods passed the check, then failed at its first call with
    Python's "object NoneType can't be used in 'await' expression", after its plain save had kept
    the batch the caller was told had failed."""
    from collections.abc import Awaitable

    from omem_core import InMemoryMemoryStore, Memory, create_observational_memory_store
    from omem_core.observations import ObservationRecord

    class Plain:  # what a first try at a store over a dict looks like
        def __init__(self) -> None:
            self.saved: list = []

        def save_messages(self, messages) -> None:  # type: ignore[no-untyped-def]
            self.saved.extend(messages)

        async def recall(self, thread_id, *, last=None, before=None):  # type: ignore[no-untyped-def]
            return []

        async def delete_thread(self, thread_id) -> None:  # type: ignore[no-untyped-def]
            return None

    plain = Plain()
    with pytest.raises(TypeError, match=r"^storage\.save_messages of Plain is a plain function \(def, not async def\) "
                                        r"returning None, but a store's methods are awaited: declare it 'async def "
                                        r"save_messages'"):
        Memory(storage=plain)

    class Yields(InMemoryMemoryStore):
        async def recall(self, thread_id, *, last=None, before=None):  # type: ignore[no-untyped-def,override]
            yield []

    with pytest.raises(TypeError, match=r"^inner\.recall of Yields is an async generator \(it yields\)"):
        create_observational_memory_store(Yields(), observer="omem/extractive")

    class Records:  # an observation store with one plain method
        async def list(self, thread_id: str) -> list[ObservationRecord]:
            return []

        def save(self, record: ObservationRecord) -> None: ...

        async def delete_by_thread(self, thread_id: str) -> None: ...

    with pytest.raises(TypeError, match=r"^observations\.save of Records is a plain function"):
        create_observational_memory_store(observer="omem/extractive", observations=Records())

    class Forwards:  # plain methods that return awaitables, and say so: accepted, and they work
        def __init__(self) -> None:
            self.inner = InMemoryMemoryStore()

        def save_messages(self, messages) -> Awaitable[None]:  # type: ignore[no-untyped-def]
            return self.inner.save_messages(messages)

        def recall(self, thread_id, *, last=None, before=None) -> "Awaitable[list]":  # type: ignore[no-untyped-def]
            return self.inner.recall(thread_id, last=last, before=before)

        def delete_thread(self, thread_id) -> Awaitable[None]:  # type: ignore[no-untyped-def]
            return self.inner.delete_thread(thread_id)

    memory = Memory(storage=Forwards())
    asyncio.run(memory.save_messages([Message(id="m1", thread_id="t", role="user", content="hello", created_at=T0)]))
    assert [m.content for m in asyncio.run(memory.recall("t"))] == ["hello"]

    class Proxy:  # a forwarding proxy without annotations: taken on trust, as before
        def __init__(self) -> None:
            self.inner = InMemoryMemoryStore()

        def save_messages(self, messages):  # type: ignore[no-untyped-def]
            return self.inner.save_messages(messages)

        def recall(self, thread_id, *, last=None, before=None):  # type: ignore[no-untyped-def]
            return self.inner.recall(thread_id, last=last, before=before)

        def delete_thread(self, thread_id):  # type: ignore[no-untyped-def]
            return self.inner.delete_thread(thread_id)

    Memory(storage=Proxy())

    def in_a_thread(function):  # type: ignore[no-untyped-def]  (a decorator that makes a plain method async)
        @functools.wraps(function)
        async def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            return await asyncio.to_thread(function, *args, **kwargs)
        return run

    class Threaded(InMemoryMemoryStore):
        @in_a_thread
        def delete_thread(self, thread_id: str) -> None:  # type: ignore[override]
            return None

    Memory(storage=Threaded())  # (the plain function under it said "-> None": refused, though async)


def test_a_sqlite_file_that_cannot_be_opened_is_named_in_the_error(tmp_path) -> None:
    import sqlite3

    missing = tmp_path / "no" / "such" / "dir" / "x.db"
    with pytest.raises(sqlite3.OperationalError, match=f"cannot open the SQLite file {missing}: unable to open"):
        SQLiteMemoryStore(missing)
    other = tmp_path / "chat.jsonl"
    other.write_text('{"role": "user", "content": "hi"}\n' * 200)
    with pytest.raises(sqlite3.DatabaseError, match=f"cannot use the SQLite file {other}: file is not a database"):
        SQLiteObservationStore(other)
    assert other.read_text().startswith('{"role"')  # and left as it was


async def test_a_message_with_a_blank_id_or_thread_is_refused_by_every_store(tmp_path) -> None:
    """A blank id was saved and then served as a cursor ("") that names nothing."""
    for store in (InMemoryMemoryStore(), SQLiteMemoryStore(tmp_path / "m.db")):
        for blank in ({"id": ""}, {"thread_id": "  "}):
            with pytest.raises(ValueError, match="must not be empty"):
                await store.save_messages([dataclasses.replace(msg(0), **blank)])
        assert await store.recall("t", last=5) == []


async def test_a_batch_given_as_a_generator_is_saved_whole(make_memory_store) -> None:
    """SQLite read the batch twice (check, then insert): a generator saved nothing, silently."""
    from omem_core import create_observational_memory_store

    store = make_memory_store()
    await store.save_messages(msg(i) for i in range(3))
    assert [m.id for m in await store.recall("t", last=10)] == ["m0", "m1", "m2"]
    memory = Memory(make_memory_store())  # the facade, and a wrapper over the store, alike
    await memory.save_messages(iter([msg(i, thread="u") for i in range(2)]))
    assert [m.id for m in await memory.recall("u")] == ["m0", "m1"]
    wrapped = create_observational_memory_store(make_memory_store(), observer="omem/extractive")
    await wrapped.save_messages(msg(i, thread="w") for i in range(2))
    assert [m.id for m in await wrapped.recall("w", last=5)] == ["m0", "m1"]


async def test_every_store_closes_alike(tmp_path) -> None:
    """`await store.close()` failed on the SQLite and DuckDB stores (their close() returned None),
    so code closing any store as the PostgreSQL ones are closed broke on them."""
    from omem_core.duckdb_store import DuckDBObservationStore

    async def used(store) -> None:  # a call that needs the store's connection
        await (store.recall("t", last=1) if isinstance(store, SQLiteMemoryStore) else store.list("t"))

    for make in (lambda: SQLiteMemoryStore(tmp_path / "a.db"), lambda: SQLiteObservationStore(tmp_path / "b.db"),
                 lambda: DuckDBObservationStore(tmp_path / "c.duckdb")):
        store = make()
        await used(store)
        await store.close()
        with pytest.raises(Exception, match="(?i)closed"):
            await used(store)
        store.close()  # again, and without await: closing twice is harmless
        async with make() as opened:
            await used(opened)
        with pytest.raises(Exception, match="(?i)closed"):
            await used(opened)  # closed at the end of the block
        with make() as opened:
            await used(opened)
        with pytest.raises(Exception, match="(?i)closed"):
            await used(opened)


async def test_the_in_memory_stores_close_like_the_others() -> None:
    """Code closing its stores generically (``async with memory, observations:``, ``await
    store.close()``) failed on the in-memory stores, the defaults, with an AttributeError or
    "does not support the asynchronous context manager protocol"; they have nothing to release,
    so closing keeps what they hold."""
    from omem_core import InMemoryMemoryStore
    from omem_core.observations import InMemoryObservationStore

    async with InMemoryMemoryStore() as memory, InMemoryObservationStore() as observations:
        await memory.save_messages([msg(0)])
    with memory, observations:
        pass
    await memory.close()
    memory.close()  # twice, and without await
    await observations.close()
    assert [m.id for m in await memory.recall("t", last=5)] == ["m0"] and await observations.list("t") == []


async def test_a_read_of_a_non_str_thread_and_a_message_of_wrong_types_are_refused(make_memory_store) -> None:
    """recall(None) returned [] as if the thread were empty; Message(id=1, content=5) was built
    and refused only at save (a bad role or a naive clock already failed at construction)."""
    from omem_core import create_observational_memory_store

    for store in (make_memory_store(), create_observational_memory_store(make_memory_store(), observer="omem/extractive")):
        for thread in (None, 123):
            with pytest.raises(TypeError, match=f"thread_id must be a str, got {type(thread).__name__}"):
                await store.recall(thread, last=3)
    for field, value in (("id", 1), ("content", 5), ("thread_id", None), ("resource_id", 7)):
        with pytest.raises(TypeError, match=f"{field} must be a str"):
            dataclasses.replace(msg(0), **{field: value})


async def test_a_delete_of_a_non_str_thread_is_refused_and_deletes_nothing(make_memory_store) -> None:
    """Found by a walkthrough: delete_thread(5) deleted thread "5" in SQLite (which compares
    5 = '5') and silently did nothing in the other stores."""
    from omem_core import Memory, create_observational_memory_store

    inner = make_memory_store()
    await inner.save_messages([msg(0, thread="5")])
    wrapped = create_observational_memory_store(inner, observer="omem/extractive")
    for store in (inner, wrapped, Memory(inner)):
        for thread in (5, None):
            with pytest.raises(TypeError, match=f"delete_thread: thread_id must be a str, got {type(thread).__name__}"):
                await store.delete_thread(thread)
    assert len(await inner.recall("5", last=5)) == 1
    await inner.update_working_memory("5", "name: Ada")
    for store in (inner, Memory(inner)):  # (SQLite read thread "5"'s working memory for 5)
        with pytest.raises(TypeError, match="get_working_memory: thread_id must be a str, got int"):
            await store.get_working_memory(5)


async def test_a_list_or_delete_of_records_of_a_non_str_thread_is_refused(make_observation_store) -> None:
    store = make_observation_store()
    await store.save(record(0, thread="5"))
    for operation in ("list", "list_recent", "delete_by_thread", "delete_epoch"):
        if hasattr(store, operation):
            with pytest.raises(TypeError, match=f"{operation}: thread_id must be a str, got int"):
                await getattr(store, operation)(5)
    assert len(await store.list("5")) == 1


def test_a_duckdb_file_another_process_holds_is_named_as_such(tmp_path) -> None:
    """A raw `_duckdb.IOException: Could not set lock…` did not say one process per file is the rule."""

    path = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(60)", str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        from omem_core.duckdb_store import DuckDBObservationStore

        with pytest.raises(OSError, match=f"cannot open the DuckDB file {path}: another process holds it"):
            DuckDBObservationStore(path)
    finally:
        holder.kill()
        holder.wait()


def test_a_sqlite_file_written_by_a_newer_omem_is_refused_untouched(tmp_path) -> None:
    """A file whose schema is newer than this omem knows was opened without a word, and written
    with this version's statements."""
    import sqlite3

    path = tmp_path / "v.db"
    SQLiteMemoryStore(path).close()
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA user_version = 99")
        con.execute("PRAGMA journal_mode = DELETE")  # (a review: switched to WAL before it was refused)
    before = path.read_bytes()
    for store in (SQLiteMemoryStore, SQLiteObservationStore):
        with pytest.raises(sqlite3.DatabaseError, match="version 99, written by a newer omem"):
            store(path)
    assert schema_version(path) == 99 and path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.db"]  # no -wal or -shm beside it


async def test_reads_and_deletes_of_a_key_no_store_can_hold(make_memory_store, make_observation_store) -> None:
    """A thread id with a NUL (PostgreSQL text cannot hold one, and saving it is refused there)
    read as an unknown thread in the other adapters, but leaked psycopg's DataError from every
    PostgreSQL read and delete; a lone surrogate raised UnicodeEncodeError from SQLite."""
    store, records = make_memory_store(), make_observation_store()
    await store.save_messages([msg(i) for i in range(3)])
    bad = "t\x00x"
    assert await store.recall(bad, last=3) == []
    assert await store.get_working_memory(bad) is None
    await store.delete_thread(bad)
    with pytest.raises(KeyError, match="unknown cursor"):
        await store.recall("t", last=3, before="m\x00")
    assert await records.list(bad) == []
    if hasattr(records, "list_recent"):
        assert await records.list_recent(bad) == []
    await records.delete_by_thread(bad)
    with pytest.raises(ValueError, match="recall: thread_id is not valid Unicode"):
        await store.recall("t\ud800", last=3)
    assert [m.id for m in await store.recall("t", last=3)] == ["m0", "m1", "m2"]  # nothing else touched


async def test_a_numpy_integer_reads_as_an_integer_in_every_store(make_memory_store) -> None:
    """check_read accepted NumPy integers but the stores passed the raw value to SQL: SQLite said
    "datatype mismatch"."""
    from omem_core import create_observational_memory_store

    np = pytest.importorskip("numpy")
    store = make_memory_store()
    await store.save_messages([msg(i) for i in range(5)])
    assert [m.id for m in await store.recall("t", last=np.int64(2))] == ["m3", "m4"]
    assert [m.id for m in await store.recall("t", last=np.int32(2), before="m3")] == ["m1", "m2"]
    wrapped = create_observational_memory_store(store, observer="omem/extractive")
    assert [m.id for m in await wrapped.recall("t", last=np.int64(2))] == ["m3", "m4"]


async def test_a_read_of_every_message_by_a_huge_last_works_through_the_memory_layer(make_memory_store) -> None:
    """``last=sys.maxsize`` ("all of them") worked on a store alone but failed through the memory
    layer on SQLite and PostgreSQL with the driver's overflow error: it doubled ``last`` for its
    page size, past a database's 64-bit integer. A larger count than any store holds reads the same."""

    from omem_core import create_observational_memory_store

    inner = make_memory_store()
    await inner.save_messages([msg(i) for i in range(3)])
    wrapped = create_observational_memory_store(inner, observer="omem/extractive")
    for last in (sys.maxsize, 10**20):
        assert [m.id for m in await inner.recall("t", last=last)] == ["m0", "m1", "m2"]
        assert [m.id for m in await wrapped.recall("t", last=last)] == ["m0", "m1", "m2"]
    assert [m.id for m in await Memory(inner, last_messages=10**20).recall("t")] == ["m0", "m1", "m2"]


@pytest.fixture(params=["sqlite messages", "sqlite observations", "duckdb observations", "postgres messages",
                        "postgres observations"])
def closed_store(request, tmp_path):
    """A store of each adapter that holds a connection, closed."""
    adapter, kind = request.param.split()
    if adapter == "postgres":
        space = request.getfixturevalue("pg")
        store = getattr(space.fresh(), "memory" if kind == "messages" else "observations")()
    elif adapter == "duckdb":
        from omem_core.duckdb_store import DuckDBObservationStore

        store = DuckDBObservationStore(tmp_path / "o.duckdb")
    else:
        store = (SQLiteMemoryStore if kind == "messages" else SQLiteObservationStore)(tmp_path / "s.db")
    return store


async def test_a_closed_store_says_it_is_closed_alike_in_every_adapter(closed_store) -> None:
    """After ``close()``, SQLite said "Cannot operate on a closed database." and DuckDB "Connection
    already closed!" (naming neither the store nor the file), PostgreSQL "this store (…) is closed":
    the stores close the same way, and say so the same way."""
    await closed_store.close()
    await closed_store.close()  # (idempotent)
    s = closed_store
    calls = ([lambda: s.recall("t", last=1), lambda: s.save_messages([msg(0)]), lambda: s.delete_thread("t")]
             if isinstance(s, MemoryStore)
             else [lambda: s.list("t"), lambda: s.list_recent("t"), lambda: s.save(record(0)),
                   lambda: s.delete_by_thread("t")])
    for call in calls:
        with pytest.raises(RuntimeError, match=r"^this store \(.+\) is closed$"):
            await call()


async def test_closing_several_stores_closes_each_once_even_when_one_fails() -> None:
    """What ``Memory.close()`` and the wrapper's ``close()`` rely on: a store whose ``close()``
    fails does not leave the next one open, a store given twice closes once, a store without
    ``close()`` is left alone, and the first failure is raised afterwards."""
    from omem_core.memory import close_stores

    closed: list[str] = []

    class Failing:
        def close(self) -> None:
            closed.append("failing")
            raise OSError("disk gone")

    class Pooled:
        async def close(self) -> None:
            closed.append("pooled")

    pooled = Pooled()
    with pytest.raises(OSError, match="disk gone"):
        await close_stores(Failing(), pooled, pooled, object(), None)
    assert closed == ["failing", "pooled"]


async def test_a_cursor_that_is_no_message_id_is_refused_alike(make_memory_store) -> None:
    """Found by a review: recall(before=3) matched message "3" in SQLite (which compares 3 = '3'),
    failed in SQL in PostgreSQL ("operator does not exist") and was an unknown cursor in memory; a
    lone surrogate raised UnicodeEncodeError from SQLite and PostgreSQL."""
    from omem_core import create_observational_memory_store

    inner = make_memory_store()
    await inner.save_messages([dataclasses.replace(msg(i), id=str(i)) for i in range(4)])
    wrapped = create_observational_memory_store(inner, observer="omem/extractive")
    for store in (inner, wrapped, Memory(inner)):
        with pytest.raises(TypeError, match="recall: before must be a message id .a str. or None, got int 3"):
            await store.recall("t", last=5, before=3)
        with pytest.raises(ValueError, match="recall: before is not valid Unicode"):
            await store.recall("t", last=5, before="\ud800")
    assert [m.id for m in await inner.recall("t", last=5, before="3")] == ["0", "1", "2"]


async def test_a_delete_of_a_thread_no_store_can_hold_is_refused_and_the_store_stays_writable(
        make_memory_store, tmp_path) -> None:
    """Found by a review: SQLite's delete_thread("t\\ud800") raised UnicodeEncodeError inside its
    transaction and left it open: every later write of that store failed, and every other process
    sharing the file found it locked until the store was closed."""
    import sqlite3

    store = make_memory_store()
    await store.save_messages([msg(0)])
    with pytest.raises(ValueError, match="delete_thread: thread_id is not valid Unicode"):
        await store.delete_thread("t\ud800")
    await store.save_messages([msg(1)])  # (was: "cannot start a transaction within a transaction")
    assert [m.id for m in await store.recall("t", last=5)] == ["m0", "m1"]
    if isinstance(store, SQLiteMemoryStore):
        other = sqlite3.connect(store._db.path, timeout=1)  # another process's view of the file
        try:
            other.execute("INSERT INTO omem_working_memory VALUES ('x', 'y')")
            other.commit()
        finally:
            other.close()


@pytest.mark.parametrize("when", [
    datetime(2024, 11, 3, 1, 30, fold=1),  # the hour New York's clocks repeat, the second time
    datetime(2024, 3, 10, 2, 30),  # the hour they skip
], ids=["repeated hour", "skipped hour"])
async def test_a_time_in_an_hour_a_clock_change_repeats_or_skips_reads_back_and_saves_again(
        make_memory_store, when) -> None:
    """Found by a review: SQLite and PostgreSQL read a ZoneInfo time in such an hour back with a
    fixed offset, which Python never calls equal to it, so saving the same message again (a retry,
    documented as safe) was refused as an edit. A message keeps its time with a fixed offset now."""
    from zoneinfo import ZoneInfo

    message = Message(id="m1", thread_id="t", role="user", content="hi",
                      created_at=when.replace(tzinfo=ZoneInfo("America/New_York")))
    assert message.created_at.utcoffset() == timedelta(hours=-5)  # (the second 1:30 is EST; 2:30 counts as EST)
    store = make_memory_store()
    await store.save_messages([message])
    assert await store.recall("t", last=5) == [message]
    await store.save_messages([message])  # a retry: a no-op
    assert await store.recall("t", last=5) == [message]


async def test_a_full_disk_is_the_error_sqlite_gives_not_a_failed_rollback(tmp_path) -> None:
    """Found by a review: after "database or disk is full" SQLite has rolled the transaction back
    itself, and the store's own ROLLBACK then raised "cannot rollback - no transaction is active",
    hiding the real error."""
    import sqlite3

    store = SQLiteMemoryStore(tmp_path / "full.db")
    await store.save_messages([msg(0)])
    pages = store._db.con.execute("PRAGMA page_count").fetchone()[0]
    store._db.con.execute(f"PRAGMA max_page_count = {pages + 3}")  # a disk that fills up
    big = [dataclasses.replace(msg(i), content="x" * 3000) for i in range(1, 11)]
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        await store.save_messages(big)
    assert [m.id for m in await store.recall("t", last=20)] == ["m0"]  # the batch: all or nothing
    await store.delete_thread("t")  # and the store goes on
    store.close()


def test_the_schema_version_of_a_file_creates_nothing(tmp_path) -> None:
    """It created an empty file at a path that had none, and never closed its connection."""
    with pytest.raises(FileNotFoundError, match="no SQLite file at"):
        schema_version(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    SQLiteMemoryStore(tmp_path / "omem.db").close()  # (in WAL mode)
    assert schema_version(tmp_path / "omem.db") >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["omem.db"]  # no -wal or -shm left beside it


async def test_a_delete_leaves_no_lease_a_crashed_process_left(tmp_path) -> None:
    """Found by a review: a lease row of a process that crashed mid-pass stayed in the file for
    good, naming its thread after the thread was deleted (concepts: "a deleted thread leaves
    nothing behind, not even its id")."""
    import asyncio
    import sqlite3

    store = SQLiteObservationStore(tmp_path / "o.db")
    assert await store.try_lease("secret-thread", "crashed", ttl=0.01)  # never given back
    assert await store.try_lease("other", "alive", ttl=60)
    await asyncio.sleep(0.05)
    await store.delete_by_thread("secret-thread")
    con = sqlite3.connect(tmp_path / "o.db")
    try:
        assert con.execute("SELECT thread_id FROM omem_leases").fetchall() == [("other",)]  # a live one stays
    finally:
        con.close()
    store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def make_lease_store(request, tmp_path):
    """The adapters with the lease capability."""
    return _fresh(request, None, SQLiteObservationStore, tmp_path, "l", "observations")


async def test_a_lease_of_a_thread_no_store_can_hold_is_refused_alike(make_lease_store) -> None:
    """SQLite's lease calls raised UnicodeEncodeError for a lone surrogate (the wrapper checks the
    thread first; direct users of the lease capability did not get the same error as elsewhere)."""
    store = make_lease_store()
    with pytest.raises(ValueError, match="try_lease: thread_id is not valid Unicode"):
        await store.try_lease("t\ud800", "me", ttl=1)
    with pytest.raises(ValueError, match="release_lease: thread_id is not valid Unicode"):
        await store.release_lease("t\ud800", "me")
    assert await store.try_lease("t", "me", ttl=1)
    await store.close()


async def test_a_sqlite_delete_that_fails_half_way_rolls_back_and_leaves_the_file_writable(tmp_path) -> None:
    """A delete_thread failing after its first statement left its transaction open: the thread
    half deleted in this connection, and the file's write lock held against every process."""
    import sqlite3

    path = tmp_path / "m.db"
    store = SQLiteMemoryStore(path)
    await store.save_messages([msg(0)])
    other = sqlite3.connect(path, timeout=1)  # another process's view of the file
    try:
        other.execute("CREATE TRIGGER refuse BEFORE DELETE ON omem_working_memory "
                      "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END")
        await store.update_working_memory("t", "notes")
        with pytest.raises(sqlite3.IntegrityError, match="refused by a trigger"):
            await store.delete_thread("t")
        assert [m.id for m in await store.recall("t", last=5)] == ["m0"]  # all or nothing
        other.execute("INSERT INTO omem_working_memory VALUES ('x', 'y')")  # not locked
        other.commit()
        await store.save_messages([msg(1)])
    finally:
        other.close()
        store.close()
