"""What a newcomer's first session runs into: the cache, bad models, bad files, the CLI and the app
process. Each test drives the real entry points (the CLI in its own process where the process
matters, litellm for every model call)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import run_together

from workbench.cli import cli
from workbench.datasets import load_conversation
from workbench.replay import ConfigurationError, ReplayConfig, replay
from workbench.runstore import RunStore

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "datasets" / "tiny.jsonl"
SMALL = {"observation_threshold": 40, "reflection_threshold": 60, "last_messages": 2}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_the_cache_is_chosen_per_run_not_once_per_process(tmp_path) -> None:
    conversation = load_conversation(TINY)
    config = ReplayConfig(**SMALL)

    def hits(folder: Path) -> tuple[int, int]:
        result = asyncio.run(replay(conversation, config, cache_dir=folder))
        return result.cache_hits, result.observer_calls + result.reflector_calls

    first_hits, calls = hits(tmp_path / "a")
    assert calls > 0 and first_hits == 0
    assert hits(tmp_path / "a") == (calls, calls)  # served from a's file
    assert hits(tmp_path / "b") == (0, calls)  # b is its own, empty cache: nothing leaks from a
    assert (tmp_path / "b" / "litellm-cache.sqlite").exists()


def test_the_offline_models_cached_answers_are_not_served_to_another_version_of_its_code(tmp_path) -> None:
    """The offline model's answers were cached under its name alone: after an upgrade of omem (or
    an edit of its algorithm) the cache served what the old code wrote, so a replay or a benchmark
    showed the old model's notes. Another version here: a copy of omem_core whose offline model's
    code differs by one line, in its own process."""
    import shutil

    conversation = load_conversation(TINY)
    config = ReplayConfig(**SMALL)
    cache = tmp_path / "cache"
    first = asyncio.run(replay(conversation, config, cache_dir=cache))
    calls = first.observer_calls + first.reflector_calls
    assert calls > 0 and first.cache_hits == 0
    other = tmp_path / "other"
    shutil.copytree(ROOT / "omem_core", other / "omem_core", ignore=shutil.ignore_patterns("__pycache__"))
    with (other / "omem_core" / "extractive" / "algorithm.py").open("a") as handle:
        handle.write("\n# another version of the offline model\n")
    script = ("import asyncio, json, sys, omem_core\n"
              f"assert omem_core.__file__.startswith({str(other)!r}), omem_core.__file__\n"
              "from workbench.datasets import load_conversation\n"
              "from workbench.replay import ReplayConfig, replay\n"
              f"result = asyncio.run(replay(load_conversation({str(TINY)!r}), ReplayConfig(**{SMALL!r}), "
              f"cache_dir={str(cache)!r}))\n"
              "print(json.dumps([result.cache_hits, result.observer_calls + result.reflector_calls]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(other), str(ROOT)])})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, calls]  # nothing of the other code's served
    again = asyncio.run(replay(conversation, config, cache_dir=cache))
    assert (again.cache_hits, again.observer_calls + again.reflector_calls) == (calls, calls)  # its own: kept


def test_workers_that_create_one_cache_at_once_all_get_it(tmp_path) -> None:
    """An experiment's workers start together and all create the same new cache file. Switching
    it to WAL mode fails at once with "database is locked" for all but one of them unless it is
    retried: about one start in ten failed before (a worker reported the cache folder as not
    writable), so this starts 8 workers together 20 times."""
    from workbench.cache import prepare_cache  # loaded before the fork, so no child imports anything

    for trial in range(20):
        folder = tmp_path / str(trial)
        outcomes = run_together(lambda: prepare_cache(folder))
        assert outcomes == ["ok"] * 8, outcomes


def test_a_cache_folder_that_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("OMEM_CACHE_DIR", str(blocked / "cache"))
    code, _, err = invoke("replay", "--dataset", str(TINY), "--db", str(tmp_path / "r.duckdb"))
    assert code == 1 and "model-call cache folder" in err and "OMEM_CACHE_DIR" in err and "--no-cache" in err
    assert "Traceback" not in err
    with RunStore(tmp_path / "r.duckdb") as store:  # the run says what stopped it; nothing is left running
        [run] = store.runs().to_dict("records")
        assert run["status"] == "failed" and "cache folder" in run["error"]
    code, out, _ = invoke("replay", "--dataset", str(TINY), "--db", str(tmp_path / "r.duckdb"), "--no-cache", "--json")
    assert code == 0 and json.loads(out.splitlines()[-1])["status"] == "completed"


def test_an_unknown_model_is_refused_within_seconds_and_the_run_is_marked_failed(tmp_path) -> None:
    db = tmp_path / "r.duckdb"
    started = time.monotonic()
    done = run_cli("replay", "--observer", "gpt-nonexistent", "--db", str(db), "--json", timeout=60)
    assert done.returncode == 1
    assert "gpt-nonexistent: litellm does not know which provider serves it" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1  # one line
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    with RunStore(db) as store:
        assert store.run(summary["run_id"])["status"] == "failed"
    assert time.monotonic() - started < 30  # refused before any replay work (litellm's import included)


def test_a_missing_provider_key_is_refused_before_any_call(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with RunStore(tmp_path / "r.duckdb") as store:
        with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY") as caught:
            asyncio.run(replay(load_conversation(TINY), ReplayConfig(reflector="anthropic/claude-haiku-4-5"), store))
        run = store.run(caught.value.run_id)
        assert run["status"] == "failed" and run["steps"] == 0


def test_resume_reports_the_whole_run(tmp_path) -> None:
    from conftest import scripted_provider

    db = str(tmp_path / "r.duckdb")
    with scripted_provider() as scripted:
        scripted.replies = ["- a", "- b", RuntimeError("rate limited")]
        code, out, _ = invoke("replay", "--dataset", str(ROOT / "datasets" / "demo.jsonl"), "--observer",
                              "scripted/model", "--reflector", "none", "--observation-threshold", "300",
                              "--no-cache", "--json", "--yes", "--db", db)
        failed = json.loads(out.strip().splitlines()[-1])
        assert code == 1 and failed["partial"] and failed["observer_calls"] == 3  # two saved, one failed
        code, out, _ = invoke("replay", "--resume", failed["run_id"], "--json", "--yes", "--db", db)
    resumed = json.loads(out.strip().splitlines()[-1])
    with RunStore(db) as store:
        run = store.run(failed["run_id"])
        calls = store.model_calls(failed["run_id"])
    assert code == 0 and resumed["status"] == "completed" and not resumed["partial"]
    assert resumed["observer_calls"] == run["observer_calls"] == len(calls) > failed["observer_calls"]
    assert resumed["steps"] == run["steps"] == 100


def test_a_corrupt_or_truncated_store_is_a_clear_error_and_left_untouched(tmp_path) -> None:
    good = tmp_path / "good.duckdb"
    with RunStore(good) as store:
        asyncio.run(replay(load_conversation(TINY), ReplayConfig(**SMALL, cache=False), store))
    data = good.read_bytes()
    truncated = tmp_path / "truncated.duckdb"
    truncated.write_bytes(data[: len(data) // 3])
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_bytes(b"this is not a database at all\n" * 100)
    for path in (truncated, garbage):
        before = path.read_bytes()
        code, _, err = invoke("runs", "--db", str(path))
        assert code == 1 and f"cannot open {path}" in err and "Traceback" not in err, err
        assert path.read_bytes() == before  # nothing written to it


@pytest.mark.parametrize("name, content, kind", [
    ("conversation.json", '[{"id": "m1", "role": "user", "content": "hi"}]\n', "a JSON file"),
    ("chat.jsonl", '{"id": "m1", "role": "user", "content": "hi"}\n', "a JSON Lines file"),
    ("table.csv", "a,b\n1,2\n", "a CSV file"),
])
def test_a_dataset_file_given_as_db_is_refused_untouched(tmp_path, name, content, kind) -> None:
    """DuckDB 2 opens a JSON, CSV or Parquet file as a database of views over it, where the run
    store's tables were made in memory: the command failed later with a traceback ("Table with name
    runs does not exist"). Mixing up --dataset and --db is an easy slip."""
    path = tmp_path / name
    path.write_text(content)
    for args in (["runs"], ["experiment", "list"], ["replay", "--dataset", str(TINY)]):
        code, _, err = invoke(*args, "--db", str(path))
        assert code == 1 and "Traceback" not in err, err
        assert f"cannot open {path}: it is {kind}, not a DuckDB run store (a dataset is given with --dataset)" in err
        assert path.read_text() == content and sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_parquet_file_given_as_db_is_refused_untouched(tmp_path) -> None:
    import pandas as pd

    path = tmp_path / "runs.pq"
    pd.DataFrame({"a": [1]}).to_parquet(path)
    before = path.read_bytes()
    code, _, err = invoke("runs", "--db", str(path))
    assert code == 1 and "it is a Parquet file, not a DuckDB run store" in err and path.read_bytes() == before


def test_a_sqlite_file_given_as_db_never_makes_duckdb_fetch_an_extension(tmp_path) -> None:
    path = tmp_path / "memory.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    before = path.read_bytes()
    done = run_cli("runs", "--db", str(path), timeout=60)
    assert done.returncode == 1
    assert "a SQLite database, not a DuckDB run store" in done.stderr and "Traceback" not in done.stderr
    assert "install" not in done.stderr.lower() and "http" not in done.stderr.lower()
    assert path.read_bytes() == before


def test_export_to_a_path_with_quotes(tmp_path) -> None:
    db = tmp_path / "r.duckdb"
    with RunStore(db) as store:
        run_id = asyncio.run(replay(load_conversation(TINY), ReplayConfig(**SMALL, cache=False), store)).run_id
    folder = tmp_path / "it's \"here\"; DROP TABLE runs; --"
    code, out, err = invoke("export", run_id, "--parquet", str(folder), "--db", str(db))
    assert code == 0, err
    assert (folder / "steps.parquet").exists() and str(folder / "steps.parquet") in out
    with RunStore(db) as store:
        assert len(store.runs()) == 1


def test_resume_of_an_unknown_id_says_so_plainly(tmp_path) -> None:
    RunStore(tmp_path / "r.duckdb").close()  # (a store that is not there is said so: test_cli)
    code, _, err = invoke("replay", "--resume", "no-such-run", "--db", str(tmp_path / "r.duckdb"))
    db = tmp_path / "r.duckdb"
    # (the listing command names the file: pasted as it is, it lists that store's runs)
    assert code == 1 and err.strip() == f"Error: no run no-such-run in {db} (python -m workbench runs --db {db} lists them)"


def test_a_busy_store_makes_the_cli_wait_then_work(tmp_path) -> None:
    """A writer that finds the file busy waits (bounded, with a message) instead of failing at once."""
    db = tmp_path / "r.duckdb"
    RunStore(db).close()
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(db)!r}); "
                               "print('ready', flush=True); time.sleep(3); c.close(); print('released', flush=True)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        done = run_cli("runs", "--db", str(db), timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 0, done.stderr
    assert "waiting for" in done.stderr and "no runs in" in done.stdout
    done = run_cli("runs", "--db", str(db), env={"OMEM_DB_WAIT": "0.3"}, timeout=60)
    assert done.returncode == 0  # free again


def test_the_quick_cli_paths_import_neither_litellm_nor_streamlit(tmp_path) -> None:
    """Also with runs recorded: naming a labelled run in `runs` once loaded the whole library (4 s)."""
    db = str(tmp_path / "r.duckdb")
    for extra in ([], ["--label", "nightly"]):
        assert invoke("replay", "--dataset", str(TINY), "--last-messages", "2", "--db", db, *extra)[0] == 0
    code, out, _ = invoke("experiment", "run", "--dataset", str(TINY), "--observation-threshold", "40,60",
                          "--concurrency", "1", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    probe = ("import sys, runpy; sys.argv = ['workbench'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('workbench', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in ('litellm', 'streamlit', 'omem_core') if m in sys.modules))")
    # (`experiment show` loaded litellm for one test of a run's error: 13-20 s before its first line)
    for args in (["--help"], ["runs", "--db", db], ["runs", "--db", str(tmp_path / "empty.duckdb")], ["datasets"],
                 ["experiment", "show", experiment_id, "--db", db], ["experiment", "list", "--db", db], ["cache"]):
        done = subprocess.run([sys.executable, "-c", probe, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == "LOADED []", (args, done.stdout[-500:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_stopping_the_app_command_stops_the_server(tmp_path) -> None:
    port = _free_port()
    db = tmp_path / "r.duckdb"
    env = {k: v for k, v in os.environ.items() if k != "OMEM_DB"}
    process = subprocess.Popen([sys.executable, "-m", "workbench", "app", "--headless", "--port", str(port),
                                "--db", str(db)], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not _listening(port):
            assert process.poll() is None and time.monotonic() < deadline, "the app did not start"
            time.sleep(0.2)
        # `--db`, as every command takes it: the server (this very process, exec'd) uses that store
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert f"OMEM_DB={db}".encode() in environ
        process.send_signal(signal.SIGTERM)  # what a service manager or `kill` sends to the command
        process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _listening(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _listening(port)  # no orphan server left holding the port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_sweep_lists_failed_configurations_with_their_error(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, out, err = invoke("sweep", "--dataset", str(TINY), "--observer", "omem/extractive,gpt-4o-mini",
                            "--observation-threshold", "40", "--reflection-threshold", "60", "--last-messages", "2",
                            "--db", str(tmp_path / "r.duckdb"))
    assert code == 1  # not every configuration finished
    assert "failed: obs model gpt-4o-mini: cannot replay" in err and "missing OPENAI_API_KEY" in err
    assert "1 of 2 configurations failed" in err
    rows = [line for line in out.splitlines()[1:] if line.strip()]
    assert len(rows) == 2 and sum("completed" in r for r in rows) == 1 and sum("failed" in r for r in rows) == 1
    assert "nan" not in out.lower()


def test_the_cli_offers_every_registered_format() -> None:
    from workbench.datasets import FORMATS

    replay_command = cli.commands["replay"]
    [option] = [p for p in replay_command.params if p.name == "fmt"]
    assert tuple(option.type.choices) == FORMATS and "longmemeval" in FORMATS
    code, out, _ = invoke("datasets")
    assert code == 0 and "longmemeval-sample" in out and "probes" in out


def test_paths_are_shown_as_short_as_still_works_from_here(tmp_path, monkeypatch) -> None:
    from workbench.formatting import short_path as _shown_path

    demo = ROOT / "datasets" / "demo.jsonl"
    monkeypatch.chdir(ROOT)
    assert _shown_path(demo) == "datasets/demo.jsonl"
    assert _shown_path(ROOT.parent / "elsewhere.jsonl") == "../elsewhere.jsonl"
    code, out, _ = invoke("datasets")
    [line] = [row for row in out.splitlines() if row.startswith("demo ")]
    assert line.split()[2:] == ["1", "200", "22", "22", "datasets/demo.jsonl"]  # conversations, messages,
    # probes, those with a gold answer, path
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert _shown_path(demo) == str(demo)  # "../../../…" would be longer and harder to read
    assert _shown_path("x.jsonl") == "x.jsonl"


def test_a_conversation_whose_dates_go_backwards_fails_clearly(tmp_path) -> None:
    """The library refuses a message dated behind what was already observed: the run says which."""
    rows = []
    for i in range(12):
        hour = 9 if i == 11 else 10  # the last message is dated before everything observed
        day = 1 if i == 11 else i + 1
        rows.append(json.dumps({"conversation_id": "c", "id": f"m{i}", "role": ("user", "assistant")[i % 2],
                                "content": f"message number {i} " + "words " * 30,
                                "timestamp": f"2024-01-{day:02d}T{hour:02d}:00:00+00:00"}))
    path = tmp_path / "backwards.jsonl"
    path.write_text("\n".join(rows) + "\n")
    code, out, err = invoke("replay", "--dataset", str(path), "--observation-threshold", "40", "--last-messages", "2",
                            "--json", "--db", str(tmp_path / "r.duckdb"), "--no-cache")
    assert code == 1 and "Traceback" not in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "failed" and "message m11 cannot be replayed" in summary["error"]
    # no resume hint: a resume would stop at the same message and print the same hint (a loop)
    assert "--resume" not in err and "correct or re-date that message in the dataset" in err


def test_an_experiment_says_which_run_a_backwards_date_stopped_and_offers_no_resume_for_it(tmp_path) -> None:
    """Found by a walkthrough: `experiment run` printed "failed: message m11 cannot be replayed: …"
    with no conversation or configuration, offered a resume that would stop at the same message,
    and said the failed conversation's probes had "their evidence still in the final window"."""
    rows = []
    for conversation in ("fine", "backwards"):
        for i in range(12):
            late = conversation == "backwards" and i == 11  # dated before everything observed
            rows.append({"conversation_id": conversation, "id": f"{conversation}-m{i}", "role": ("user", "assistant")[i % 2],
                         "content": f"message number {i} " + "words " * 30,
                         "timestamp": f"2024-01-{1 if late else i + 1:02d}T{9 if late else 10:02d}:00:00+00:00"})
        rows.append({"type": "probe", "conversation_id": conversation, "id": f"{conversation}-p1",
                     "question": "What number came first?", "answer": "number 0", "evidence": [f"{conversation}-m0"]})
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    db = str(tmp_path / "r.duckdb")
    code, out, err = invoke("experiment", "run", "--dataset", str(path), "--observation-threshold", "40,60",
                            "--window", "2", "--db", db, "--no-cache")
    assert code == 1 and "Traceback" not in err
    for label in ("obs 40", "obs 60"):
        assert f"failed: {label} on backwards: message backwards-m11 cannot be replayed" in err, err
    assert "experiment resume" not in err and "correct or re-date that message in the dataset" in err
    assert "2 runs stopped on a message of the dataset" in err
    asked = next(line for line in (out + err).replace("\n    ", " ").splitlines() if line.startswith("probes:"))
    assert "1 in conversations no run completed" in asked, asked
    code, out, _ = invoke("experiment", "list", "--json", "--db", db)
    [experiment_id] = [e["experiment_id"] for e in json.loads(out)]
    code, out, _ = invoke("experiment", "show", experiment_id, "--json", "--db", db)
    data = json.loads(out.strip().splitlines()[-1])
    assert data["dataset_failed_runs"] == 2 and data["failed_runs"] == 2
    assert [c["errors"][0].split(":")[0] for c in data["configs"]] == ["backwards", "backwards"]


def test_a_threshold_the_library_refuses_is_a_clear_error(tmp_path) -> None:
    code, _, err = invoke("replay", "--dataset", str(TINY), "--observation-threshold", "50000",
                          "--db", str(tmp_path / "r.duckdb"), "--no-cache")
    # the cap is named (not max_input_tokens, which neither the CLI nor the app sets)
    assert code == 2 and "at most 16,000 tokens (the workbench's limit" in err and "Traceback" not in err


def test_a_wrong_format_override_says_what_the_file_is(tmp_path) -> None:
    code, _, err = invoke("replay", "--dataset", str(ROOT / "datasets" / "demo.jsonl"), "--format", "locomo",
                          "--db", str(tmp_path / "r.duckdb"))
    assert code == 1 and "is not in the locomo format: its content is omem" in err and "invalid JSON" not in err


def test_resuming_something_already_completed_says_so(tmp_path) -> None:
    db = str(tmp_path / "r.duckdb")
    code, out, _ = invoke("replay", "--dataset", str(TINY), "--json", "--no-cache", "--db", db)
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
    code, out, err = invoke("replay", "--resume", run_id, "--db", db)
    assert code == 0 and "already completed: nothing to resume" in err and out == ""


def test_missing_figures_of_every_kind_read_as_a_dash() -> None:
    import numpy as np
    import pandas as pd

    from workbench.formatting import display, money, progress, ratio

    for value in (None, float("nan"), np.float64("nan"), pd.NA, pd.NaT):
        assert display(value) == ratio(value) == money(value) == "–"
    assert progress("failed", 0, pd.NA) == "failed at step 0" and progress("failed", 3, 100) == "failed at step 3 of 100"
    assert display(0) == "0" and ratio(3.94) == "3.9x" and money(0.0) == "$0"
    assert money(0.00123) == "$0.0012" and money(12.346) == "$12.35"  # (a headline that fits its column)
    # a paid call cheaper than the digits shown is not "$0.00" (read as free: the offline model's "$0")
    assert money(0.0004, 2) == "<$0.01" and money(0.00004) == "<$0.0001" and money(0.006, 2) == "$0.01"


def test_figures_round_half_up_like_the_charts_and_never_read_minus_zero() -> None:
    import pandas as pd

    from workbench import charts
    from workbench.formatting import display, fixed, money, ratio, share, tokens

    # 5.25 is exact in binary: Python's own format would print 5.2 while Plotly's ".1f" prints 5.3.
    assert fixed(5.25, 1) == "5.3" and ratio(5.25) == "5.3x" and share(0.125, 2) == "0.13"
    assert fixed(2.675, 2) == "2.67"  # (2.675 is 2.67499… in binary: no tie, both read 2.67)
    assert display(0.6786) == "0.679" and tokens(1234.5) == "1,235" and money(1234.565) == "$1,234.57"
    assert tokens(-0.4) == "0" and display(-0.0001) == "-0.00010" and share(-0.0004, 3) == "0.000"
    assert ratio(1e27) == "1000000000000000013287555072.0x" and ratio(float("inf")) == "infx"  # never raises
    runs = pd.DataFrame({"observation_threshold": [300, 600], "reflection_threshold": [2000, 2000],
                         "compression": [5.25, 3.0], "retention": [0.6786, 0.5]})
    assert list(charts.heatmap(runs, "compression").data[0].text[0]) == ["5.3x", "3.0x"]  # as the table says
    assert list(charts.heatmap(runs, "retention").data[0].text[0]) == ["0.679", "0.500"]


def test_counts_read_as_english() -> None:
    from workbench.formatting import count

    assert count(1, "run") == "1 run" and count(0, "run") == "0 runs" and count(2, "probe") == "2 probes"
    assert count(1204, "message") == "1,204 messages" and count(3, "analysis", "analyses") == "3 analyses"


def test_the_quickstart_shows_both_steps_and_keeps_the_safety_fact() -> None:
    """The README's offline demo made 3 observations and never reflected (its reflection threshold
    was never crossed), and its memory had lost the sister's peanut allergy."""
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert done.returncode == 0, done.stderr
    first, memory = done.stdout.splitlines()[0], done.stdout.split("[system]")[1].split("[user]")[0]
    assert "1 reflection" in first and "observations" in first
    assert "peanut" in memory and "Anika" in memory


def test_json_output_keeps_progress_on_a_terminal(tmp_path) -> None:
    """Found by a new user: `experiment resume --json` in a terminal said nothing for 12 s while
    runs finished (progress was off with --json): it looked hung. On a terminal the progress lines
    come on stderr (stdout is the JSON alone); on a pipe or a log they stay off, as before."""
    import pty

    db = tmp_path / "runs.duckdb"
    command = [sys.executable, "-m", "workbench", "experiment", "run", "--dataset", "demo", "--observation-threshold",
               "150,300", "--concurrency", "1", "--json", "--db", str(db)]
    env = {**os.environ, "OMEM_CACHE_DIR": str(tmp_path / "cache")}
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    said = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # (the pty's other end closed: the process ended)
            break
        if not chunk:
            break
        said += chunk
    out = process.communicate(timeout=300)[0]
    os.close(leader)
    assert process.returncode == 0 and json.loads(out.decode().strip().splitlines()[-1])["status"] == "completed"
    assert b"[1/2]" in said and b"[2/2]" in said, said
    piped = subprocess.run(command, cwd=ROOT, capture_output=True, env=env, timeout=300)
    assert piped.returncode == 0 and b"[1/2]" not in piped.stderr, piped.stderr


def test_a_reader_that_goes_away_does_not_fail_the_replay_or_experiment(tmp_path) -> None:
    """Found by a new user: `replay ... 2>&1 | head -1` (or quitting a pager) failed the replay with
    a BrokenPipeError at its next progress line, recorded as the run's error; an experiment failed
    the same way. Progress is best effort now: the work finishes and is recorded."""
    db = tmp_path / "runs.duckdb"
    for args in (("replay", "--observation-threshold", "60", "--reflection-threshold", "120"),
                 ("experiment", "run", "--dataset", "demo", "--observation-threshold", "60,90,120",
                  "--reflection-threshold", "240",
                  "--concurrency", "1")):
        process = subprocess.Popen([sys.executable, "-m", "workbench", *args, "--db", str(db)], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMEM_CACHE_DIR": str(tmp_path / "cache")})
        assert process.stdout.readline()  # the first line, as `head -1` reads it; then the reader goes
        process.stdout.close()
        process.wait(timeout=300)
    with RunStore(db) as store:
        runs = store.runs()
        assert len(runs) == 4 and set(runs.status) == {"completed"}, runs[["status", "error"]].to_dict("records")
        [experiment] = store.experiments().to_dict("records")
        assert experiment["status"] == "completed"
