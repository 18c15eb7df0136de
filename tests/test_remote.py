"""The remote path over real HTTP: litellm's ``openai/`` provider with ``api_base`` pointed at a small
OpenAI-compatible server on 127.0.0.1 (``tests/openai_server.py``) that answers, waits, rate-limits
(429) and fails (500) as scripted. Shared calls, retries, timeouts, the cost limit, cost accounting
and call traces are checked end to end through the experiment scheduler."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from openai_server import OpenAIServer
from workbench.cache import RateLimiter
from workbench.cli import cli
from workbench.runstore import RunStore

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "datasets" / "tiny.jsonl"
MODEL = "openai/gpt-4o-mini"  # priced in litellm's map, so costs are computed


@pytest.fixture(autouse=True)
def environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def note(body: dict) -> str:
    """A deterministic note per request, so identical requests get identical answers."""
    return "- " + str(abs(hash(json.dumps(body["messages"], sort_keys=True))) % 10_000)


def run(server: OpenAIServer, db: Path, *extra: str) -> tuple[int, dict, str]:
    # (a list option given twice joins its values: the reflector is given once, ``extra``'s if any)
    reflector = () if "--reflector" in extra else ("--reflector", MODEL)
    code, out, err = invoke("experiment", "run", "--dataset", str(TINY), "--observer", MODEL, *reflector,
                            "--observation-threshold", "40", "--window", "2", "--api-base", server.url,
                            "--json", "--yes", "--db", str(db), *extra)
    return code, json.loads(out.strip().splitlines()[-1]), err


def test_identical_concurrent_calls_reach_the_model_once_and_costs_and_traces_are_recorded(tmp_path) -> None:
    db = tmp_path / "x.duckdb"
    with OpenAIServer(reply=note, delay=0.3) as server:
        code, data, err = run(server, db, "--reflection-threshold", "60,200", "--concurrency", "4")
    assert code == 0, err
    ok = server.ok()
    observer = [r for r in ok if "<messages>" in r.body["messages"][-1]["content"]]
    bodies = [json.dumps(r.body["messages"], sort_keys=True) for r in observer]
    assert len(bodies) == len(set(bodies)) > 0  # two configurations, the same observer calls: paid once
    with RunStore(db) as store:
        runs = store.experiment_runs(data["experiment_id"])
        calls = [store.model_calls(r) for r in runs.run_id]
    observe_events = sum(int((c.stage == "observe").sum()) for c in calls)
    assert observe_events == 2 * len(set(bodies))  # each configuration recorded every call it made
    assert sum(int(c.cache_hit.sum()) for c in calls) >= len(set(bodies))  # the twin's calls: served
    # cost: litellm priced the calls that reached the model; the shared ones cost nothing again
    total = sum(c["cost_usd"] for c in data["configs"])
    assert total > 0 and all(c["cost_usd"] is not None for c in data["configs"])
    # traces: what the server received is what the run store says was sent, reply included
    first = calls[0][calls[0].cache_hit == False].iloc[0]  # noqa: E712
    [sent] = json.loads(first.request)
    [reply] = json.loads(first.response)
    assert any(r.body["messages"] == sent for r in ok) and reply == note({"messages": sent})


def test_a_key_in_the_server_address_is_never_written_and_a_resume_still_reaches_it(tmp_path, monkeypatch) -> None:
    """A proxy taking its key in the address: the address was recorded whole in the experiment's
    options and litellm's cache keys quoted it in the cache file."""
    secret = "pk-SECRET1234567890abcd"
    monkeypatch.setenv("PROXY_API_KEY", secret)
    db = tmp_path / "x.duckdb"
    with OpenAIServer(reply=note) as server:
        keyed = server.url.replace("/v1", f"/{secret}/v1")
        code, out, err = invoke("experiment", "run", "--dataset", str(TINY), "--observer", MODEL, "--reflector", "none",
                                "--observation-threshold", "40", "--window", "2", "--api-base", keyed,
                                "--json", "--yes", "--db", str(db))
        assert code == 0, err
        data = json.loads(out.strip().splitlines()[-1])
        with RunStore(db) as store:
            options = store.experiment(data["experiment_id"])["options"]
            [run_id] = store.experiment_runs(data["experiment_id"]).run_id
            store.delete_run(run_id)  # left to a resume, which must reach the same server
        assert options["api_base"] == server.url.replace("/v1", "/[PROXY_API_KEY]/v1")
        reached = len(server.ok())
        code, out, err = invoke("experiment", "resume", data["experiment_id"], "--yes", "--json", "--db", str(db))
        assert code == 0, err
        assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"
        # the same calls to the same server: served from the cache (an address read back with
        # "[PROXY_API_KEY]" in it would be another server, asked again)
        assert len(server.ok()) == reached
    for path in [db, *(tmp_path / "cache").rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert reached > 0


def test_a_cost_with_calls_at_no_known_price_is_unknown_not_the_priced_part(tmp_path) -> None:
    """A reflector litellm has no price for: the total summed the priced observer calls only and
    printed it as the cost ($0.0053 for 27 calls, 2 of them unpriced)."""
    db = tmp_path / "x.duckdb"
    with OpenAIServer(reply=lambda body: note(body) + " and a fact" * 20) as server:  # notes to reflect
        code, out, err = invoke("experiment", "run", "--dataset", str(TINY), "--observer", MODEL,
                                "--reflector", "openai/my-private-model", "--observation-threshold", "40",
                                "--reflection-threshold", "10", "--window", "2", "--api-base", server.url,
                                "--json", "--yes", "--db", str(db))
    assert code == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    with RunStore(db) as store:
        [run_id] = store.experiment_runs(data["experiment_id"]).run_id
        calls = store.model_calls(run_id)
        assert (calls.cost_usd > 0).any() and calls.cost_usd.isna().any()  # some priced, some not
        cost = store.run(run_id)["cost_usd"]
        assert cost is None or cost != cost  # NULL (read back as NaN)
    assert data["configs"][0]["cost_usd"] is None
    code, out, _ = invoke("experiment", "show", data["experiment_id"], "--db", str(db))
    assert code == 0 and "$0." not in out


def test_rate_limits_and_server_errors_are_retried_with_backoff(tmp_path) -> None:
    with OpenAIServer(reply=note, failures=[429, 500, 429]) as server:
        code, data, err = run(server, tmp_path / "x.duckdb", "--num-retries", "3", "--concurrency", "1")
    assert code == 0, err
    statuses = [r.status for r in server.received]
    assert statuses[:3] == [429, 500, 429] and statuses[3:] and set(statuses[3:]) == {200}
    assert data["configs"][0]["runs"] == 1 and data["configs"][0]["failed"] == 0


def test_a_server_that_keeps_failing_fails_the_run_with_the_reason(tmp_path) -> None:
    with OpenAIServer(fail_always=500) as server:
        code, data, err = run(server, tmp_path / "x.duckdb", "--num-retries", "1", "--concurrency", "1")
    assert code == 1
    [config] = data["configs"]
    assert config["runs"] == 0 and config["failed"] == 1
    assert "InternalServerError" in config["errors"][0] and "observe pass failed" in config["errors"][0]
    assert len(server.received) == 2  # the call and its one retry, then the run stops


def test_a_slow_model_times_out_cleanly(tmp_path) -> None:
    with OpenAIServer(reply=note, delay=3.0) as server:
        started = time.monotonic()
        code, data, err = run(server, tmp_path / "x.duckdb", "--timeout", "0.5", "--num-retries", "0")
    assert code == 1 and time.monotonic() - started < 30
    assert "timed out after 0.5 s" in data["configs"][0]["errors"][0]


def test_the_cost_limit_stops_cleanly_and_resume_finishes(tmp_path) -> None:
    db = tmp_path / "x.duckdb"
    with OpenAIServer(reply=note, usage=(200_000, 1_000)) as server:  # ~$0.03 a call at gpt-4o-mini prices
        code, data, err = run(server, db, "--reflection-threshold", "60,200,400", "--concurrency", "1",
                              "--max-cost", "0.05")
        assert code == 1 and "cost limit of $0.0500 was reached" in err
        assert data["status"] == "stopped"
        with RunStore(db) as store:
            runs = store.experiment_runs(data["experiment_id"])
        assert len(runs) < 3  # stopped before the end; no half-written run
        assert set(runs.status) <= {"completed"}
        # what is left is estimated and asked about, as a new experiment is (a resume started unasked)
        declined = CliRunner().invoke(cli, ["experiment", "resume", data["experiment_id"], "--max-cost", "100",
                                            "--db", str(db)], input="n\n")
        assert declined.exit_code == 1 and "not resumed" in declined.stderr
        assert f"{3 - len(runs)} run{'s' if 3 - len(runs) > 1 else ''} left to replay; cost about $" in declined.stderr
        with RunStore(db) as store:
            assert len(store.experiment_runs(data["experiment_id"])) == len(runs)  # nothing replayed
            assert store.experiment(data["experiment_id"])["options"]["max_cost"] == 0.05  # nor changed
        code, out, err = invoke("experiment", "resume", data["experiment_id"], "--max-cost", "100", "--yes",
                                "--json", "--db", str(db))
    assert code == 0, err
    finished = json.loads(out.strip().splitlines()[-1])
    assert finished["status"] == "completed" and [c["runs"] for c in finished["configs"]] == [1, 1, 1]


def test_the_calls_of_runs_the_cost_limit_cut_off_are_counted_in_the_spend(tmp_path) -> None:
    """Found by a researcher: the stop said "$0.0202 spent" and `experiment show` "$0.0060": the
    calls of the runs in flight when the limit stopped them were paid, and recorded nowhere."""
    import litellm

    db = tmp_path / "x.duckdb"
    price = sum(litellm.cost_per_token(model=MODEL, prompt_tokens=200_000, completion_tokens=1_000))
    with OpenAIServer(reply=note, usage=(200_000, 1_000), delay=0.2) as server:
        code, data, err = run(server, db, "--reflection-threshold", "60,200,400", "--concurrency", "3",
                              "--max-cost", "0.1", "--no-cache")
        paid = len(server.ok())
    assert code == 1 and data["status"] == "stopped", err
    with RunStore(db) as store:
        runs = store.experiment_runs(data["experiment_id"])
        assert len(runs) < 3 and paid > (runs.observer_calls + runs.reflector_calls).sum()  # some cut off
    said = float(re.search(r"\(\$([0-9.]+) spent\)", err).group(1))
    code, out, err = invoke("experiment", "show", data["experiment_id"], "--json", "--db", str(db))
    spent = json.loads(out.strip().splitlines()[-1])["spent_usd"]
    assert spent == pytest.approx(said, abs=5e-5)  # what the stop said is what `show` says
    # every call whose answer came back; the calls cancelled in flight (at most one per run in
    # flight) answered the server but not us: their price is unknown here (docs/experiments.md)
    assert (paid - 3) * price - 1e-9 <= spent <= paid * price + 1e-9 and spent > 0


def test_the_rate_limiter_spaces_calls() -> None:
    async def acquire_all() -> float:
        limiter = RateLimiter(2, period=0.5)  # 2 calls per half second
        started = time.monotonic()
        await asyncio.gather(*(limiter.acquire() for _ in range(5)))
        return time.monotonic() - started

    elapsed = asyncio.run(acquire_all())
    assert 1.0 <= elapsed < 3.0  # calls 3-4 wait one period, call 5 a second one


def test_the_rate_limiter_holds_across_event_loops_and_threads() -> None:
    """The app runs each experiment in a thread with its own event loop, and the limiter (one per
    model and limit) is kept by the process: its asyncio.Lock, bound to the first experiment's loop,
    raised "bound to a different event loop" in the next one, and litellm then called the model
    without waiting (10 calls in a minute at --rpm 6)."""
    import threading

    limiter = RateLimiter(2, period=0.4)
    times: list[float] = []
    errors: list[BaseException] = []

    async def take(n: int) -> None:
        async def one() -> None:
            await limiter.acquire()
            times.append(time.monotonic())

        await asyncio.gather(*(one() for _ in range(n)))

    def experiment() -> None:  # as background.start does: a thread, and asyncio.run in it
        try:
            asyncio.run(take(4))  # (the fourth waits while the third holds the limiter: a contended lock)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    for _ in range(2):  # one experiment after another: the second meets the limiter the first used
        thread = threading.Thread(target=experiment)
        thread.start()
        thread.join(30)
    assert errors == [] and len(times) == 8
    times.sort()
    assert all(later - earlier >= 0.4 - 0.01 for earlier, later in zip(times, times[2:]))  # never 3 in a period


def test_a_call_cancelled_in_flight_does_not_hold_up_the_next_identical_call(tmp_path) -> None:
    """An identical call in flight is shared; a first call cancelled by the library's timeout (or
    Stop) was reported to no callback, so the next identical call of the loop waited for it until
    its own timeout (15 minutes without one) instead of asking the model, which answered at once.
    Through the library, as a replay makes the call: its timeout (since Python 3.12 wait_for cancels
    nothing of a bare coroutine) and a memory whose first pass failed and is read again."""
    from datetime import datetime, timedelta, timezone

    from omem_core import CompactionError, Memory, Message, create_observational_memory_store
    from workbench.cache import completion_kwargs, enable_litellm_cache, prepare_cache

    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    said = [Message(id=f"m{i}", thread_id="t", role=("user", "assistant")[i % 2], content=f"Fact number {i} is here.",
                    created_at=start + timedelta(minutes=i)) for i in range(8)]

    async def reads(server: OpenAIServer) -> str:
        assert enable_litellm_cache()
        store = create_observational_memory_store(
            observer=MODEL, reflector=None, thresholds={"observation": 10}, timeout=1.0,
            completion_kwargs={"api_base": server.url, **completion_kwargs(prepare_cache(tmp_path / "calls"))})
        memory = Memory(store, last_messages=2)
        await memory.save_messages(said)
        with pytest.raises(CompactionError, match="timed out"):
            await memory.recall("t")  # the model is slow: the call is cancelled at the timeout
        server.delay = 0.0
        read = await asyncio.wait_for(memory.recall("t"), 20)  # the same call again: answered at once
        return read[0].content

    with OpenAIServer(reply=lambda body: "- answered", delay=3.0) as server:
        assert "answered" in asyncio.run(reads(server))
        assert len(server.received) == 2


def test_identical_calls_are_shared_within_each_event_loop_of_the_process(tmp_path) -> None:
    """The app runs experiments in threads, each on its own event loop: a call in flight was kept
    per cache key alone, so a second loop's identical call took the first loop's place, and a
    later identical call of the first loop did not wait for its own loop's call (one more request),
    or waited for a future the other thread released."""
    import threading

    import litellm

    from workbench.cache import completion_kwargs, enable_litellm_cache, prepare_cache

    def experiment(server: OpenAIServer, first_delay: float, errors: list) -> None:
        async def both() -> None:
            async def call() -> str:
                reply = await litellm.acompletion(
                    model=MODEL, api_base=server.url, messages=[{"role": "user", "content": "one call"}],
                    **completion_kwargs(prepare_cache(tmp_path / "calls")))
                return reply.choices[0].message.content

            await asyncio.sleep(first_delay)
            leader = asyncio.ensure_future(call())
            await asyncio.sleep(0.4)  # the other thread's identical call is in flight by now
            assert await asyncio.wait_for(call(), 30) == await leader == "- shared"

        try:
            asyncio.run(both())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    assert enable_litellm_cache()
    errors: list = []
    with OpenAIServer(reply=lambda body: "- shared", delay=1.5) as server:
        threads = [threading.Thread(target=experiment, args=(server, delay, errors)) for delay in (0.0, 0.2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == [] and len(server.received) == 2  # one per loop: each loop's second call waited


def test_rpm_reaches_the_gate_in_front_of_the_model(tmp_path) -> None:
    """With --rpm, the calls that reach the model go through a limiter (one per model)."""
    import litellm

    with OpenAIServer(reply=note) as server:
        code, data, err = run(server, tmp_path / "x.duckdb", "--rpm", "1000", "--concurrency", "2")
    assert code == 0, err
    limiters = litellm.cache.cache._limiters
    assert (MODEL, 1000.0) in limiters and len(limiters[(MODEL, 1000.0)]._times) == len(server.ok())


def test_rpm_holds_with_the_cache_off_and_nothing_is_stored(tmp_path) -> None:
    """--rpm rides on litellm's question to its cache before each call, which it asks only with
    caching on: with --no-cache the limit was ignored (--rpm 2: four requests in the same second)."""
    import litellm

    with OpenAIServer(reply=note) as server:
        code, data, err = run(server, tmp_path / "x.duckdb", "--rpm", "999", "--no-cache", "--concurrency", "2")
    assert code == 0, err
    limiter = litellm.cache.cache._limiters[(MODEL, 999.0)]
    assert len(server.ok()) > 0 and len(limiter._times) == len(server.ok())  # every request took a slot
    assert not (tmp_path / "cache").exists()  # and nothing was kept (OMEM_CACHE_DIR)


def test_two_servers_under_one_model_string_never_share_cached_answers(tmp_path) -> None:
    """litellm's cache key leaves the server out: the second server's run was served the first
    one's answers (every call a cache hit), and a server failing every call looked completed."""
    db = tmp_path / "x.duckdb"
    with OpenAIServer(reply=lambda body: "- server one says so") as one:
        code, first, err = run(one, db, "--reflector", "none")
    assert code == 0, err
    with OpenAIServer(reply=lambda body: "- server two says so") as two:
        code, second, err = run(two, db, "--reflector", "none")
        assert code == 0, err
        asked = len(two.ok())
        code, repeat, err = run(two, db, "--reflector", "none")  # the same server again: its own answers
        assert code == 0, err
    assert asked > 0 and len(two.ok()) == asked  # served from the cache the second time
    with RunStore(db) as store:
        [run_id] = store.experiment_runs(second["experiment_id"]).run_id
        calls = store.model_calls(run_id)
        assert not calls.cache_hit.any()
        assert {json.loads(r)[0] for r in calls.response} == {"- server two says so"}
    with OpenAIServer(fail_always=401) as broken:
        code, third, _ = run(broken, db, "--reflector", "none")
    assert code == 1 and third["configs"][0]["failed"] == 1


def test_a_key_quoted_in_a_providers_error_is_never_printed_or_stored(tmp_path, monkeypatch) -> None:
    """Some servers answer a rejected key by quoting it ("Incorrect API key provided: Bearer
    sk-…"): the error is shown and stored with the variable's name in place of its value."""
    key = "sk-LEAKCHECK-abcdef1234567890"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    db = tmp_path / "x.duckdb"
    with OpenAIServer(fail_always=401, echo_key=True) as server:
        code, data, err = run(server, db, "--reflector", "none", "--no-cache")
    assert server.api_key_seen and key in server.api_key_seen[0]  # it was sent, and quoted back
    assert code == 1 and key not in err and key not in json.dumps(data)
    assert "[OPENAI_API_KEY]" in data["configs"][0]["errors"][0]
    with RunStore(db) as store:
        [run_id] = store.experiment_runs(data["experiment_id"]).run_id
        stored = [store.run(run_id)["error"], *store.model_calls(run_id).error.dropna()]
    assert stored and all(key not in text and "[OPENAI_API_KEY]" in text for text in stored)
    assert key not in db.read_bytes().decode("latin-1")  # nowhere in the file


def test_a_key_echoed_in_a_providers_reply_is_stored_as_its_name(tmp_path, monkeypatch) -> None:
    """A reply that quotes the key (a prompt injection, a debugging proxy) becomes a note, a trace
    and a reflection: none of them carries the key into the run store."""
    key = "sk-LEAKCHECK-reply-0987654321"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    db = tmp_path / "x.duckdb"
    with OpenAIServer(reply=lambda body: f"- the user's key is {key}") as server:
        code, data, err = run(server, db, "--no-cache")
    assert code == 0, err
    with RunStore(db) as store:
        [run_id] = store.experiment_runs(data["experiment_id"]).run_id
        records, calls = store.records(run_id), store.model_calls(run_id)
    assert len(records) and all("[OPENAI_API_KEY]" in text for text in records.text)
    assert calls.response.notna().all() and all("[OPENAI_API_KEY]" in text for text in calls.response)
    assert key not in db.read_bytes().decode("latin-1")  # nowhere in the file


def test_a_key_echoed_in_a_reply_never_reaches_the_model_call_cache(tmp_path, monkeypatch) -> None:
    """The cache kept a reply that quoted the key as it was sent (only the run store was
    redacted): it is written with the variable's name, and a re-run served from it records the same."""
    key = "sk-LEAKCHECK-cache-1122334455"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))
    db = tmp_path / "x.duckdb"
    with OpenAIServer(reply=lambda body: f"- the user's key is {key}") as server:
        assert run(server, db)[0] == 0
        served = len(server.ok())
        code, data, err = run(server, db)
        assert code == 0, err
        assert len(server.ok()) == served  # the second run came from the cache
    cache = (tmp_path / "cache" / "litellm-cache.sqlite")
    assert cache.exists() and all(key not in f.read_bytes().decode("latin-1")
                                  for f in cache.parent.iterdir())  # nor in the WAL beside it
    with RunStore(db) as store:
        [run_id] = store.experiment_runs(data["experiment_id"]).run_id
        assert all("[OPENAI_API_KEY]" in text for text in store.records(run_id).text)


def test_the_cache_namespace_follows_the_server_litellm_calls(monkeypatch, tmp_path) -> None:
    """litellm sends a call to its api_base, else $OPENAI_BASE_URL, else $OPENAI_API_BASE: the
    cache keeps answers under that same server (a stale $OPENAI_API_BASE beside the
    $OPENAI_BASE_URL in use must not name it)."""
    from workbench.cache import completion_kwargs

    monkeypatch.setenv("OPENAI_API_BASE", "http://stale:1/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://used:2/v1")
    assert completion_kwargs(tmp_path)["cache"]["namespace"] == "server http://used:2/v1"
    assert completion_kwargs(tmp_path, api_base="http://given:3/v1/")["cache"]["namespace"] == \
        "server http://given:3/v1"
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_BASE")
    assert "namespace" not in completion_kwargs(tmp_path)["cache"]  # no server named: keys as before
