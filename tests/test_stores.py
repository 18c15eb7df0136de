"""The ports' contract, run against every adapter (in-memory and SQLite), and the Memory facade."""

from __future__ import annotations

import itertools
import random
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
)
from omem_core.sqlite import SQLiteMemoryStore, SQLiteObservationStore, schema_version


def _fresh(request, in_memory, sqlite, directory, prefix):
    """A factory of fresh stores of the fixture's adapter (SQLite: a new file each time)."""
    if request.param == "memory":
        return in_memory
    paths = (directory / f"{prefix}{i}.db" for i in itertools.count())
    return lambda: sqlite(next(paths))


@pytest.fixture(params=["memory", "sqlite"])
def make_memory_store(request, tmp_path):
    return _fresh(request, InMemoryMemoryStore, SQLiteMemoryStore, tmp_path, "m")


@pytest.fixture(params=["memory", "sqlite"])
def make_observation_store(request, tmp_path):
    return _fresh(request, create_in_memory_observation_store, SQLiteObservationStore, tmp_path, "o")


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
    with pytest.raises(NotImplementedError, match="Bare"):
        await memory.get_working_memory("t")


def recent_suffix_start(records: list[ObservationRecord]) -> int:
    """Reference: where ``list_recent`` starts in a full, creation-ordered record list."""
    newest: dict[str, int] = {}
    for index in range(len(records) - 1, -1, -1):
        newest.setdefault(records[index].kind, index)
        if len(newest) == 2:
            break
    if "reflection" not in newest:
        return 0
    return min(newest.values())  # the newest observation when it precedes the reflection


def record(i: int, kind: str = "observation", sources: tuple[str, ...] = ()) -> ObservationRecord:
    return ObservationRecord(id=f"r{i}", thread_id="t", resource_id=None,
                             created_at=T0 + timedelta(seconds=i), kind=kind,  # type: ignore[arg-type]
                             source_ids=sources or (f"m{i}",), text=f"note {i}")


async def test_observation_store_contract(make_observation_store) -> None:
    store = make_observation_store()
    assert isinstance(store, ObservationStore)
    for i in range(3):
        await store.save(record(i))
    assert [r.id for r in await store.list("t")] == ["r0", "r1", "r2"]
    with pytest.raises(ValueError, match="never edited"):
        await store.save(record(1))
    await store.delete_by_thread("t")
    assert await store.list("t") == []


async def test_list_recent_is_the_documented_suffix(make_observation_store) -> None:
    rng = random.Random(3)
    for trial in range(50):
        store = make_observation_store()
        kinds = [rng.choice(["observation", "observation", "reflection"]) for _ in range(rng.randrange(1, 15))]
        kinds[0] = "observation"
        for i, kind in enumerate(kinds):
            await store.save(record(i, kind))
        full = await store.list("t")
        assert await store.list_recent("t") == full[recent_suffix_start(full):]  # type: ignore[attr-defined]
        if "reflection" in kinds:
            newest_ref = max(i for i, k in enumerate(kinds) if k == "reflection")
            newest_obs = max(i for i, k in enumerate(kinds) if k == "observation")
            assert recent_suffix_start(full) == min(newest_ref, newest_obs)
        else:
            assert recent_suffix_start(full) == 0


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
    assert schema_version(path) == len(_MIGRATIONS) == 2
    SQLiteMemoryStore(path).close()  # reopening migrates nothing twice
    assert schema_version(path) == 2


async def test_sqlite_upgrades_an_older_file(tmp_path) -> None:
    import sqlite3

    from omem_core.sqlite import _MIGRATIONS

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as con:  # a file written by schema version 1
        con.executescript(_MIGRATIONS[0] + "; PRAGMA user_version = 1;")
        con.execute("INSERT INTO omem_records (id, thread_id, created_at, kind, source_ids, text) "
                    "VALUES ('r1', 't', '2024-01-01T00:00:00+00:00', 'observation', '[\"m1\"]', 'kept')")
    store = SQLiteObservationStore(path)
    assert schema_version(path) == 2
    assert [r.text for r in await store.list("t")] == ["kept"]
    assert await store.try_lease("t", "me", 30)


async def test_sqlite_persists_across_reopen(tmp_path) -> None:
    path = tmp_path / "p.db"
    first = SQLiteMemoryStore(path)
    await first.save_messages([msg(i) for i in range(5)])
    first.close()
    again = SQLiteMemoryStore(path)
    assert [m.id for m in await again.recall("t", last=2, before="m4")] == ["m2", "m3"]
