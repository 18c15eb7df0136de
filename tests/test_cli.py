"""`python -m workbench`: the CLI end to end (click's CliRunner, in process)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import Scripted, held_by_another_process, priced_scripted_model

from workbench.catalog import DEMO_DATASET, PROJECT_DATASETS
from workbench.cli import cli
from workbench.datasets import load_conversation
from workbench.replay import ReplayConfig, replay
from workbench.runstore import RunStore, RunStoreError

TINY = str(PROJECT_DATASETS / "tiny.jsonl")
SMALL = ["--observation-threshold", "40", "--reflection-threshold", "60", "--last-messages", "4"]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("OMEM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OMEM_DB", str(tmp_path / "cli.duckdb"))


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("args", [("replay", "--dataset", "BAD"), ("sweep", "--dataset", "BAD"),
                                  ("experiment", "run", "--dataset", "BAD"), ("experiment", "show", "nope"),
                                  ("compare", "a", "b"), ("replay", "--observer", "nosuch/model")])
def test_with_json_an_error_still_ends_stdout_with_one_json_object(tmp_path, args) -> None:
    """The README's "last stdout line: one JSON object" held only on success: a dataset that
    cannot be read printed nothing to stdout."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [')
    args = tuple(str(bad) if a == "BAD" else a for a in args)
    code, out, err = invoke(*args, "--json", "--db", str(tmp_path / "r.duckdb"))
    answer = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and answer["status"] == "failed" and answer["error"] in err
    if str(bad) in args:
        assert answer["error"].startswith(f"{bad}: ")  # names the file
    if "nosuch/model" in args:  # a run was recorded as failed: its id comes too
        assert answer["run_id"] and "litellm has no provider 'nosuch'" in answer["error"]


@pytest.mark.parametrize("args", [("replay", "--observation-threshold", "0"),
                                  ("experiment", "run", "--dataset", "/no/such/file.json"),
                                  ("sweep", "--bogus-option")])
def test_with_json_an_option_click_refuses_still_ends_stdout_with_one_json_object(args) -> None:
    code, out, err = invoke(*args, "--json")
    answer = json.loads(out.strip().splitlines()[-1])
    assert code == 2 and answer["status"] == "failed" and answer["error"] in err


@pytest.mark.parametrize("args", [("experiment", "run", "--name", "--json", "--dataset", "/no/such.json"),
                                  ("replay", "--dataset", "/no/such.json", "--", "--json")])
def test_json_given_as_a_value_does_not_ask_for_json(args) -> None:
    code, out, _ = invoke(*args)
    assert code == 2 and out == ""


@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_an_unknown_conversation_is_a_refused_option(tmp_path, command) -> None:
    """Exit 2 (a refused option, as the README says, as experiment run's): it was 1, a failure's."""
    code, out, err = invoke(command, "--dataset", TINY, "--conversation", "nope", "--json",
                            "--db", str(tmp_path / "r.duckdb"))
    assert code == 2 and "Invalid value for --conversation" in err and "'nope': not found; available: tiny" in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "failed"
    assert not (tmp_path / "r.duckdb").exists()  # nothing recorded


def test_resuming_in_a_run_store_that_does_not_exist_creates_none(tmp_path) -> None:
    db = tmp_path / "typo" / "x.duckdb"
    code, _, err = invoke("replay", "--resume", "r1", "--db", str(db))
    assert code == 1 and f"no run store at {db}" in err and not db.parent.exists()


def test_with_json_a_ctrl_c_before_the_command_handles_it_still_ends_stdout_with_json() -> None:
    """Found by a walkthrough: Ctrl-C while a command loaded its dataset or the model library (ten
    seconds at start) printed only click's "Aborted!", and no JSON line although --json promises one."""
    import click

    from workbench.cli import json_errors

    @click.command()
    @click.option("--json", "as_json", is_flag=True)
    @json_errors
    def starting(as_json: bool) -> None:
        raise KeyboardInterrupt

    result = CliRunner().invoke(starting, ["--json"])
    assert result.exit_code == 130 and "Aborted!" not in result.output  # (as a Ctrl-C the command handles)
    last = [line for line in result.output.splitlines() if line.startswith("{")][-1]
    assert json.loads(last) == {"status": "interrupted", "error": "interrupted before the command finished"}
    plain = CliRunner().invoke(starting, [])
    assert plain.exit_code == 130 and not plain.output.lstrip().startswith("{")  # without --json: no JSON


def test_a_dataset_that_cannot_be_read_is_said_before_the_model_library_loads(tmp_path) -> None:
    """Found by a walkthrough: `replay` of an empty file took 6-9 s to say so, loading litellm first."""
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    probe = ("import sys\nfrom workbench.cli import main\nsys.argv = ['workbench', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, 'litellm' in sys.modules)\n")
    for command in (["replay"], ["experiment", "run"], ["sweep"]):
        done = subprocess.run([sys.executable, "-c", probe, *command, "--dataset", str(empty), "--db",
                               str(tmp_path / "r.duckdb")], capture_output=True, text=True, timeout=120)
        assert done.stdout.split() == ["1", "False"], (command, done.stdout, done.stderr)
        assert f"{empty}: the file is empty" in done.stderr
    assert not (tmp_path / "r.duckdb").exists()  # (nor a run store made for nothing)


def test_a_ctrl_c_no_command_handles_exits_130_in_every_command() -> None:
    """Found by review: commands without --json (delete, export, …) still ended a Ctrl-C with
    click's "Aborted!" and exit status 1, which the README's 130 did not cover."""
    import click

    from workbench.cli import JsonGroup

    @click.group(cls=JsonGroup)
    def group() -> None: ...

    @group.command()
    def stopped() -> None:
        raise KeyboardInterrupt

    result = CliRunner().invoke(group, ["stopped"])
    assert result.exit_code == 130 and "interrupted" in result.output and "Aborted!" not in result.output


def test_a_ctrl_c_or_an_error_after_the_json_answer_adds_no_second_answer() -> None:
    """Found last round: a Ctrl-C after a command had printed its --json summary (while it closed
    its store) added {"status": "interrupted"} as a second JSON line, under an answer that said
    "completed", and exited with click's "Aborted!" and 1 (then, found by a walkthrough, with 130:
    the answer and the exit code disagreed)."""
    import click

    from workbench.cli import _say_json, json_errors

    @click.command()
    @click.option("--json", "as_json", is_flag=True)
    @click.option("--then", type=click.Choice(["ctrl-c", "error"]))
    @json_errors
    def finishing(as_json: bool, then: str) -> None:
        _say_json({"status": "completed"})
        if then == "ctrl-c":
            raise KeyboardInterrupt
        raise click.ClickException("closing failed")

    for then, code in (("ctrl-c", 0), ("error", 1)):  # (the answer's code: it had completed)
        result = CliRunner().invoke(finishing, ["--json", "--then", then])
        answers = [line for line in result.output.splitlines() if line.startswith("{")]
        assert result.exit_code == code and answers == ['{"status": "completed"}'], result.output
        assert "Aborted!" not in result.output
    assert "the command had finished" in CliRunner().invoke(finishing, ["--json", "--then", "ctrl-c"]).output


def test_a_terminal_is_told_the_model_library_is_loading_and_a_script_is_not() -> None:
    """Found by a walkthrough: a replay printed nothing for ten seconds while litellm loaded."""
    import io
    import sys as system

    from workbench.cli import _loading_note

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, piped = Terminal(), io.StringIO()
    loaded = system.modules.pop("litellm", None)
    try:
        assert _loading_note(terminal) and "loading the model library" in terminal.getvalue()
        assert not _loading_note(piped) and piped.getvalue() == ""  # scripts and logs stay as they were
    finally:
        if loaded is not None:
            system.modules["litellm"] = loaded
    if loaded is not None:  # once it is loaded, nothing to wait for: nothing said
        later = Terminal()
        assert not _loading_note(later) and later.getvalue() == ""


def test_without_json_an_option_error_prints_nothing_to_stdout() -> None:
    code, out, err = invoke("delete", "--json")  # a command that has no --json
    assert code == 2 and out == "" and "No such option '--json'" in err


@pytest.mark.parametrize("args", [("runs",), ("runs", "--json"), ("experiment", "list"), ("experiment", "list", "--json"),
                                  ("experiment", "show", "exp-1"), ("compare", "a", "b"), ("delete", "r1", "--yes"),
                                  ("export", "r1", "--parquet", "OUT"), ("experiment", "resume", "exp-1"),
                                  ("experiment", "export", "exp-1", "--parquet", "OUT")])
def test_a_command_that_only_reads_creates_no_run_store(tmp_path, args) -> None:
    """`experiment list --db /typo/x.duckdb` created the folder and a 780 KB store there and said
    "no experiments"; `experiment show ID --db typo.duckdb` did the same before its error."""
    db = tmp_path / "typo" / "x.duckdb"
    code, out, err = invoke(*[str(tmp_path / "out") if a == "OUT" else a for a in args], "--db", str(db))
    assert not db.parent.exists()
    if args[-1] == "--json":
        assert code == 0 and json.loads(out) == []
    elif args[0] == "runs" or args[1] == "list":
        assert code == 0 and "(no such file yet)" in out
    else:
        assert code == 1 and f"no run store at {db}" in err


def test_replay_json_last_line(tmp_path) -> None:
    code, out, _ = invoke("replay", "--dataset", TINY, *SMALL, "--json")
    assert code == 0
    summary = json.loads(out.strip().splitlines()[-1])
    for key in ("run_id", "messages", "steps", "observer_calls", "reflector_calls", "full_history_tokens",
                "final_context_tokens", "compression", "retention", "retention_full_history",
                "retention_window_only"):
        assert key in summary
    assert summary["messages"] == 12 and summary["steps"] == 6
    counts = [figures["probes"] for figures in summary["retention_per_category"].values()]
    assert counts and all(type(n) is int for n in counts)  # a count, not 32.0
    with RunStore(tmp_path / "cli.duckdb") as store:
        assert store.run(summary["run_id"])["status"] == "completed"


def test_an_earlier_built_in_prompt_version_can_be_chosen(tmp_path) -> None:
    from omem_core.prompts import OBSERVER_PROMPT_V1

    code, out, _ = invoke("replay", "--dataset", TINY, *SMALL, "--observer-prompt", "v1", "--json")
    assert code == 0
    with RunStore(tmp_path / "cli.duckdb") as store:
        config = store.run(json.loads(out.strip().splitlines()[-1])["run_id"])["config"]
    assert config["observer_prompt"]["sha256"] == OBSERVER_PROMPT_V1.sha256
    assert config["reflector_prompt"]["version"] == "v2"  # the default
    code, _, err = invoke("replay", "--dataset", TINY, "--observer-prompt", "v9")
    assert code != 0 and "Invalid value for '--observer-prompt'" in err and "'v9'" in err
    assert re.search(r"are\s+v1,\s+v2", err), err  # the versions there are, so the user can pick one

    code, out, err = invoke("sweep", "--dataset", TINY, "--observation-threshold", "40", "--reflection-threshold", "60",
                            "--observer-prompt", "v1,v2")
    assert code == 0  # the table says which prompt each run used
    # and that the offline model does not read them (the app said so, the CLI did not)
    assert "differ in observer prompt versions, but the built-in offline model ignores prompt text" in " ".join(err.split())
    rows = [line for line in out.splitlines() if "completed" in line]
    assert len(rows) == 2 and rows[0].endswith("  obs prompt v1") and rows[1].endswith("  obs prompt v2")
    assert max(len(line) for line in out.splitlines()) <= 100
    code, out, _ = invoke("sweep", "--dataset", TINY, "--observation-threshold", "40", "--reflection-threshold", "60")
    [row] = [line for line in out.splitlines() if "completed" in line]  # one configuration: named in full
    assert row.endswith("  omem/extractive / omem/extractive · obs 40 · ref 60 · window 10 · v2/v2")
    code, out, _ = invoke("compare", rows[0].split()[0], rows[1].split()[0])
    assert code == 0 and "observer prompt" in out
    [compression] = [line for line in out.splitlines() if line.startswith("compression (x)")]
    assert all(re.fullmatch(r"\d+\.\dx", value) for value in compression.split()[2:])  # 1.2x, not 1.1666666
    # The long configuration labels are above the table, which fits a terminal.
    assert out.splitlines()[0].startswith(f"A  {rows[0].split()[0]}: ") and out.splitlines()[0].endswith("v1/v2")
    assert max(len(line) for line in out.splitlines()[2:]) <= 100 and "\nconfiguration " not in out


def test_replay_defaults_to_the_demo_and_prints_figures() -> None:
    code, out, _ = invoke("replay")
    assert code == 0
    assert "messages 200" in out and "compression" in out and "retention" in out


def test_sweep_compare_runs_export(tmp_path) -> None:
    code, out, _ = invoke("sweep", "--dataset", TINY, "--observation-threshold", "30,60", "--reflection-threshold",
                          "60", "--last-messages", "4", "--json")
    assert code == 0
    runs = json.loads(out.strip().splitlines()[-1])["runs"]
    assert len(runs) == 2 and all(r["status"] == "completed" for r in runs)
    a, b = runs[0]["run_id"], runs[1]["run_id"]
    code, out, _ = invoke("compare", a, b, "--json")
    table = json.loads(out)
    assert table[a]["observation threshold"] == 30 and table[b]["observation threshold"] == 60
    code, out, _ = invoke("runs")
    assert a in out and b in out
    header, *rows = out.splitlines()
    assert header.split() == ["run", "status", "conversation", "reads", "compr", "retention", "configuration"]
    assert sorted(row.split("  ")[-1] for row in rows if row.startswith((a, b))) == ["obs 30 · ref 60 · window 4",
                                                                                      "obs 60 · ref 60 · window 4"]
    assert max(len(line) for line in out.splitlines()) <= 100
    code, out, _ = invoke("replay", "--dataset", TINY, "--last-messages", "4", "--label", "nightly baseline", "--json")
    labelled = json.loads(out.strip().splitlines()[-1])["run_id"]
    row = invoke("runs")[1].split(labelled)[1].split("\n2")[0]  # its line, and the next when wrapped
    assert " ".join(row.split()).endswith("nightly baseline (obs 1000 · ref 2000 · window 4)")  # it was not shown
    code, out, _ = invoke("export", a, "--parquet", str(tmp_path / "export"))
    assert code == 0 and "steps.parquet" in out
    before = (tmp_path / "export" / "runs.parquet").read_bytes()
    code, _, err = invoke("export", b, "--parquet", str(tmp_path / "export"))  # replaced without a word
    assert code == 2 and "already holds runs.parquet" in err and "--overwrite" in err  # a refused option
    assert (tmp_path / "export" / "runs.parquet").read_bytes() == before
    code, out, _ = invoke("export", b, "--parquet", str(tmp_path / "export"), "--overwrite")
    assert code == 0 and (tmp_path / "export" / "runs.parquet").read_bytes() != before
    code, _, err = invoke("export", b, "--parquet", str(tmp_path / "export" / "runs.parquet"))  # a file
    assert code == 2 and "runs.parquet is a file, not a folder" in err, err  # (it said "File exists")
    code, _, err = invoke("compare", a, "nope")
    assert code != 0 and "no run nope in" in err and "'nope'" not in err


def test_a_sweep_none_of_whose_configurations_can_run_is_refused_before_it_records_anything(monkeypatch) -> None:
    """It recorded one failed run per configuration (nine by default) and said the same missing key
    eighteen times; an experiment refused such a grid up front."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, out, err = invoke("sweep", "--dataset", TINY, "--observer", "gpt-4o-mini", "--yes", "--json")
    assert code == 1 and json.loads(out.strip().splitlines()[-1])["status"] == "failed"
    assert "no configuration can run here: gpt-4o-mini: missing OPENAI_API_KEY" in err
    assert err.count("OPENAI_API_KEY") == 1
    assert json.loads(invoke("runs", "--json")[1]) == []  # nothing recorded
    # one that cannot run among others that can: said before the sweep starts, recorded as failed
    code, out, err = invoke("sweep", "--dataset", TINY, "--observer", "gpt-4o-mini,omem/extractive",
                            "--observation-threshold", "40", "--reflection-threshold", "60", "--yes", "--json")
    runs = json.loads(out.strip().splitlines()[-1])["runs"]
    assert code == 1 and [r["status"] for r in runs] == ["failed", "completed"]
    assert ("warning: obs model gpt-4o-mini cannot run here and will be recorded as failed: "
            "gpt-4o-mini: missing OPENAI_API_KEY") in err
    # a provider with no model ("ollama/" needs no key) is one too: the library refuses it, and the
    # workbench listed it as usable (a paid-start question, then a failed run)
    code, out, err = invoke("sweep", "--dataset", TINY, "--observer", "ollama/", "--yes", "--json")
    assert code == 1 and "no configuration can run here: ollama/: names a provider (ollama) but no model" in err
    assert len(json.loads(invoke("runs", "--json")[1])) == len(runs)  # nothing more recorded


def test_bad_input_gets_a_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversation_id": "c", "id": "m1", "role": "robot", "content": "x", "timestamp": "2024-01-01"}\n')
    code, _, err = invoke("replay", "--dataset", str(bad))
    assert code == 1 and "bad.jsonl: line 1: field 'role': unknown role 'robot'" in err
    code, _, err = invoke("replay", "--dataset", TINY, "--observer", "no-such-model-xyz")
    assert code == 1 and "no-such-model-xyz: litellm does not know which provider serves it" in err
    code, _, err = invoke("replay", "--dataset", TINY, "--observation-threshold", "0")
    assert code == 2 and "Invalid value for '--observation-threshold': 0 is not in the range x>=1" in err
    code, _, err = invoke("replay", "--dataset", TINY, "--observer", "opena/gpt-4o")
    assert code == 1 and "opena/gpt-4o: litellm has no provider 'opena'; did you mean openai/gpt-4o?" in err
    code, _, err = invoke("replay", "--dataset", TINY, "--observer", "nope/model")  # (a walkthrough: "did you mean openai")
    assert code == 1 and "litellm has no provider 'nope' (litellm.provider_list names them)" in err
    code, _, err = invoke("replay", "--dataset", TINY, "--observer", "gpt-4o-mni")
    assert code == 1 and "gpt-4o-mni: litellm does not know this model; did you mean gpt-4o-mini?" in err


def test_a_threshold_that_is_not_a_number_is_called_not_an_integer(tmp_path) -> None:
    """`replay` said "'abc' is not a valid integer range." (click's name for a bounded integer),
    as if a range were asked for; the list options of `sweep` and `experiment run` said "integer"."""
    code, _, err = invoke("replay", "--observation-threshold", "abc", "--db", str(tmp_path / "r.duckdb"))
    assert code == 2 and "Invalid value for '--observation-threshold': 'abc' is not a valid integer." in err, err
    code, _, err = invoke("replay", "--last-messages", "0", "--db", str(tmp_path / "r.duckdb"))
    assert code == 2 and "0 is not in the range x>=1." in err, err


@pytest.mark.parametrize("command", [("sweep",), ("experiment", "run", "--dataset", TINY)])
def test_a_bad_value_in_a_list_option_is_a_usage_error_naming_it(command, tmp_path) -> None:
    db = ("--db", str(tmp_path / "r.duckdb"))
    code, _, err = invoke(*command, "--observation-threshold", "0,300", *db)
    assert code == 2 and "Invalid value for '--observation-threshold': 0 is not in the range x>=1. (in '0,300')" in err
    code, _, err = invoke(*command, "--reflection-threshold", "400,abc", *db)
    assert code == 2 and "'abc' is not a valid integer. (in '400,abc')" in err
    code, _, err = invoke(*command, "--observation-threshold", " , ", *db)
    assert code == 2 and "expected at least one value" in err
    code, _, err = invoke(*command, "--observation-threshold", "100,,200", *db)  # a value left out
    assert code == 2 and "an empty value in '100,,200'" in err
    assert not (tmp_path / "r.duckdb").exists()  # refused before anything was opened or recorded


def test_a_dataset_is_given_by_the_name_datasets_lists(tmp_path, monkeypatch) -> None:
    code, out, err = invoke("replay", "--dataset", "tiny", "--json", "--db", str(tmp_path / "r.duckdb"))
    assert code == 0, err
    with RunStore(str(tmp_path / "r.duckdb")) as store:
        assert store.run(json.loads(out.strip().splitlines()[-1])["run_id"])["dataset"] == TINY
    code, _, err = invoke("experiment", "run", "--dataset", "tinyy", "--db", str(tmp_path / "r.duckdb"))
    assert code == 2 and "no file or folder 'tinyy', and no dataset of that name (known: demo, tiny," in err
    monkeypatch.chdir(tmp_path)  # a file or folder of that name wins over the name
    (tmp_path / "tiny").mkdir()
    code, _, err = invoke("replay", "--dataset", "tiny", "--db", str(tmp_path / "r.duckdb"))
    assert code == 1 and "tiny: folder: format not recognised" in err


def test_a_dataset_put_in_the_shared_folder_is_listed_and_usable_by_name(tmp_path, monkeypatch) -> None:
    """`datasets` listed only the names written into the catalog: a LongMemEval file put beside
    the others was not listed, nor usable by its name."""
    shared = tmp_path / "shared"
    shared.mkdir()
    sample = PROJECT_DATASETS / "samples" / "longmemeval-sample.json"
    (shared / "lme-s.json").write_bytes(sample.read_bytes())
    (shared / "notes.json").write_text('{"not": "a dataset"}')
    (shared / "README.md").write_text("# about")
    (shared / "locomo-dev").mkdir()  # a known name keeps its own entry (here: absent, so none)
    (shared / "tiny.jsonl").write_bytes((PROJECT_DATASETS / "tiny.jsonl").read_bytes())  # the project has "tiny"
    (shared / "lme").mkdir()  # LongMemEval's layout: several files in one folder
    for name in ("longmemeval_s.json", "longmemeval_oracle.json"):
        (shared / "lme" / name).write_bytes(sample.read_bytes())
    monkeypatch.setenv("OMEM_SHARED_DATASETS", str(shared))
    code, out, err = invoke("datasets")
    assert code == 0, err
    listed = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert listed["lme-s"][1:6] == ["shared", "4", "18", "4", "3"] and "README" not in listed  # 3 with gold answers
    # JSON that no format reads is listed as such, with why (it was left out, unexplained)
    assert listed["notes"][1:3] == ["shared", "unreadable"] and "format not recognised" in out
    assert "locomo-dev" not in listed
    assert listed["shared/tiny"][1] == "shared" and listed["tiny"][1] == "project"  # told apart, not hidden
    assert listed["lme/longmemeval_s"][1:3] == ["shared", "4"] and "lme/longmemeval_oracle" in listed
    code, out, err = invoke("replay", "--dataset", "lme-s", "--conversation", "omem-lme-002", "--json",
                            "--db", str(tmp_path / "r.duckdb"))
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "completed"


def test_the_listing_says_why_a_shared_dataset_cannot_be_read(tmp_path, monkeypatch) -> None:
    """A cut-off download, or a folder of JSON the workbench cannot read, was left out of
    `datasets` without a word: the user saw their dataset missing and no reason."""
    shared = tmp_path / "shared"
    shared.mkdir()
    whole = (PROJECT_DATASETS / "samples" / "longmemeval-sample.json").read_bytes()
    (shared / "cut-off-longmemeval-download.json").write_bytes(whole[: len(whole) // 2])
    (shared / "export").mkdir()
    (shared / "export" / "user.json").write_text('{"id": "user-1"}')
    (shared / "docs").mkdir()  # no JSON in it: nothing to list
    (shared / "docs" / "about.txt").write_text("about")
    import shutil  # BEAM chats beside a dataset file: not one dataset, but each chat is one, listed

    shutil.copytree(PROJECT_DATASETS / "samples" / "beam-sample", shared / "mixbeam" / "1")
    (shared / "mixbeam" / "extra.json").write_bytes(whole)
    (shared / "mixbeam" / "cut.json").write_text('{"broken": ')  # no format sniffs it, beside datasets: left out
    monkeypatch.setenv("OMEM_SHARED_DATASETS", str(shared))
    code, out, err = invoke("datasets")
    assert code == 0, err
    header, *rows = out.splitlines()
    listed = {row.split()[0]: row for row in rows}
    assert "docs" not in listed
    cut = listed["cut-off-longmemeval-download"]
    assert cut.split()[1:3] == ["shared", "unreadable"] and "invalid JSON" in cut
    assert cut.count("cut-off-longmemeval-download.json") == 1  # the path once, not twice
    assert "its JSON files (user.json) are in none of the formats read" in listed["export"]
    assert {"mixbeam/1", "mixbeam/extra"} <= set(listed) and "mixbeam" not in listed
    assert listed["mixbeam/cut"].split()[1:3] == ["shared", "unreadable"] and "invalid JSON" in listed["mixbeam/cut"]
    # a name longer than the column pushes the columns, for every row alike
    assert {row.index(" shared ") if " shared " in row else row.index(" project ") for row in rows} \
        == {header.index(" origin ")}


def test_datasets_json_lists_each_dataset_with_its_figures_or_its_error(tmp_path, monkeypatch) -> None:
    """Left out last rounds: `datasets` had no --json, so a script read the table's columns."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "lme.json").write_bytes((PROJECT_DATASETS / "samples" / "longmemeval-sample.json").read_bytes())
    (shared / "cut.json").write_text('{"broken": ')
    monkeypatch.setenv("OMEM_SHARED_DATASETS", str(shared))
    code, out, err = invoke("datasets", "--json")
    assert code == 0, err
    listed = {row["name"]: row for row in json.loads(out)}
    assert {k: listed["lme"][k] for k in ("origin", "conversations", "messages", "probes", "gold")} == \
        {"origin": "shared", "conversations": 4, "messages": 18, "probes": 4, "gold": 3}
    assert len(listed["lme"]["conversation_ids"]) == 4 and "omem-lme-002" in listed["lme"]["conversation_ids"]
    assert Path(listed["lme"]["path"]) == shared / "lme.json"
    assert "invalid JSON" in listed["cut"]["error"] and "conversations" not in listed["cut"]
    assert listed["tiny"]["origin"] == "project" and listed["tiny"]["conversation_ids"] == ["tiny"]


def test_datasets_checks_files_of_ones_own_given_by_path(tmp_path) -> None:
    """Found by a researcher: `datasets` took no path, so checking a file of one's own took
    setting OMEM_SHARED_DATASETS to its folder."""
    mine = tmp_path / "mine.json"
    mine.write_bytes((PROJECT_DATASETS / "samples" / "longmemeval-sample.json").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_text('{"broken": ')
    code, out, err = invoke("datasets", "--json", str(mine), str(cut), str(tmp_path / "absent.json"))
    assert code == 1 and "2 of the 3 paths given cannot be read" in err  # (a check a script can use)
    code, _, err = invoke("datasets", str(cut))  # (one path: it read "1 of the 1 path given")
    assert code == 1 and "Error: the path given cannot be read (see above)" in err and "1 of the 1" not in err
    rows = json.loads(out)
    assert [row["name"] for row in rows] == ["mine.json", "cut.json", "absent.json"]  # these only, in order
    assert (rows[0]["origin"], rows[0]["conversations"], rows[0]["probes"]) == ("given", 4, 4)
    assert rows[0]["format"] == "longmemeval" and rows[1]["format"] is None  # (detected: it said null)
    assert "invalid JSON" in rows[1]["error"] and "does not exist" in rows[2]["error"]
    assert invoke("datasets", str(mine))[0] == 0
    code, out, _ = invoke("datasets", str(mine), str(cut))
    assert code == 1
    header, first, second = out.splitlines()
    assert first.split()[:4] == ["mine.json", "given", "4", "18"]
    assert second.split()[:3] == ["cut.json", "given", "unreadable"]


def test_a_sweep_shows_the_blind_spot_and_says_which_configurations_fell_behind(tmp_path) -> None:
    """Found by a researcher: a sweep showed 26.4x compression where half the history was in
    neither memory nor window (a replay of it said so; the sweep said nothing)."""
    lines = [json.dumps({"type": "message", "conversation_id": "long", "id": f"m{i}", "role": ("user", "assistant")[i % 2],
                         "content": " ".join(f"fact {j} of message {i} matters here" for j in range(12)),
                         "timestamp": f"2024-01-01T10:{i:02d}:00Z"}) for i in range(60)]
    data = tmp_path / "long.jsonl"
    data.write_text("\n".join(lines) + "\n")
    db = str(tmp_path / "s.duckdb")
    code, out, err = invoke("sweep", "--dataset", str(data), "--observation-threshold", "150,3000",
                            "--reflection-threshold", "4000", "--window", "2", "--db", db)
    assert code == 0, err
    said = " ".join(out.split())
    assert re.search(r"the observer fell behind in obs 150: at the end, [\d,]+ tokens of messages \(\d+% of the "
                     r"history\) are neither in memory nor in the window", said), said
    assert "fell behind in obs 3000" not in said
    header, *rows = out.splitlines()[:3]
    assert "blind spot" in header and all(re.search(r" [\d,]+ tok ", row) for row in rows)
    code, out, err = invoke("sweep", "--dataset", str(data), "--observation-threshold", "150,3000",
                            "--reflection-threshold", "4000", "--window", "2", "--db", db, "--json")
    runs = json.loads(out.strip().splitlines()[-1])["runs"]
    with RunStore(db) as store:  # the mean backlog per read, as the run store has it
        assert [r["blind_spot_tokens"] for r in runs] == [store.steps(r["run_id"]).backlog_tokens.mean() for r in runs]


def test_without_a_reflector_the_reflection_thresholds_make_no_more_configurations(tmp_path) -> None:
    """`sweep --reflector none` crossed the default reflection thresholds with the others: six runs
    of two configurations, each replayed three times under different names (experiments too)."""
    code, out, err = invoke("sweep", "--dataset", TINY, "--reflector", "none,omem/extractive",
                            "--observation-threshold", "40,80", "--reflection-threshold", "60,120", "--json",
                            "--db", str(tmp_path / "s.duckdb"))
    assert code == 0, err
    runs = json.loads(out.strip().splitlines()[-1])["runs"]
    assert len(runs) == 2 + 4  # without a reflector: one per observation threshold; with one: 2 × 2
    code, out, err = invoke("experiment", "run", "--dataset", TINY, "--reflector", "none",
                            "--observation-threshold", "40,80", "--json", "--db", str(tmp_path / "e.duckdb"))
    assert code == 0, err
    assert len(json.loads(out.strip().splitlines()[-1])["configs"]) == 2


def test_a_value_given_twice_in_a_list_option_is_one_configuration(tmp_path) -> None:
    code, out, err = invoke("experiment", "run", "--dataset", TINY, "--observation-threshold", "40,40",
                            "--observer", "omem/extractive,omem/extractive", "--concurrency", "1", "--json",
                            "--db", str(tmp_path / "r.duckdb"))
    assert code == 0, err
    [config] = json.loads(out.strip().splitlines()[-1])["configs"]  # not "config 1" and "config 2"
    assert config["config"]["observation_threshold"] == 40


def test_model_error_then_resume(scripted: Scripted, tmp_path) -> None:
    scripted.replies = ["- a", RuntimeError("rate limited")]
    args = ["replay", "--dataset", str(DEMO_DATASET), "--observer", "scripted/model", "--reflector", "none",
            "--observation-threshold", "300", "--no-cache", "--json"]
    # A model that is not the offline one: asked before it starts (its price is unknown), as an
    # experiment asks (a replay or a sweep on a paid model started unasked, its cost never shown).
    declined = CliRunner().invoke(cli, args, input="n\n", catch_exceptions=False)
    assert declined.exit_code == 1 and "cost unknown (a model's price is not known)" in declined.stderr
    assert not scripted.calls and json.loads(declined.stdout.strip().splitlines()[-1])["status"] == "failed"
    declined = CliRunner().invoke(cli, ["sweep", "--dataset", TINY, "--observer", "scripted/model", "--reflector",
                                        "none", "--observation-threshold", "40,80"], input="n\n",
                                  catch_exceptions=False)
    assert declined.exit_code == 1 and "sweep of 2 configurations on tiny: cost unknown" in declined.stderr
    with RunStore(tmp_path / "cli.duckdb") as store:
        assert store.runs().empty and not scripted.calls
    code, out, err = invoke(*args, "--yes")
    assert code == 1 and "rate limited" in err and "--resume" in err and "Start?" not in err
    failed = json.loads(out.strip().splitlines()[-1])
    assert failed["status"] == "failed" and failed["steps"] > 0
    # options the resumed run would ignore (it keeps its recorded configuration) are refused, not dropped
    code, _, err = invoke("replay", "--resume", failed["run_id"], "--observation-threshold", "50",
                          "--observer", "omem/extractive")
    assert code == 2 and "--observer, --observation-threshold cannot be given with it" in err
    code, _, err = invoke("replay", "--resume", failed["run_id"], "--label", "renamed")
    assert code == 2 and "--label cannot be given with it" in err  # (it was dropped without a word)
    code, out, _ = invoke("replay", "--resume", failed["run_id"], "--json", "--yes")
    resumed = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and resumed["run_id"] == failed["run_id"] and resumed["status"] == "completed"
    code, out, err = invoke("replay", "--resume", failed["run_id"], "--json")  # nothing left to do: still JSON
    assert code == 0 and "already completed" in err
    assert json.loads(out.strip().splitlines()[-1]) == {"run_id": failed["run_id"], "status": "completed",
                                                        "resumed": False}


def test_a_run_is_not_resumed_on_a_dataset_edited_since_it_started(scripted: Scripted, tmp_path) -> None:
    """A failed run resumed after its file was edited went on with the new messages after the old
    ones and read "completed" (30 reads of 11 planned, compression 0.99x): neither file's figures."""
    data = tmp_path / "tiny.jsonl"
    original = Path(TINY).read_text(encoding="utf-8")
    data.write_text(original, encoding="utf-8")
    scripted.replies = ["- a", RuntimeError("rate limited")]
    code, out, err = invoke("replay", "--dataset", str(data), "--observer", "scripted/model", "--reflector", "none",
                            "--observation-threshold", "30", "--last-messages", "2", "--no-cache", "--yes", "--json")
    failed = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and failed["status"] == "failed" and failed["steps"] > 0, err
    with RunStore(tmp_path / "cli.duckdb") as store:
        before = (store.run(failed["run_id"])["status"], len(store.steps(failed["run_id"])))
    for edited in (original.replace("puzzle toys", "chew toys"), "\n".join(original.splitlines()[2:]) + "\n"):
        data.write_text(edited, encoding="utf-8")
        code, out, err = invoke("replay", "--resume", failed["run_id"], "--yes", "--json")
        assert code == 1 and json.loads(out.strip().splitlines()[-1])["status"] == "failed"
        assert f"run {failed['run_id']} cannot be resumed: conversation 'tiny' changed in {data}" in err, err
        assert "start a new replay of it" in err and "cost unknown" not in err  # refused before the cost is asked
        assert ("its message 3 ('t3') has another text" in err if "chew toys" in edited
                else "it has 10 messages, the run recorded 12" in err), err
        with RunStore(tmp_path / "cli.duckdb") as store:  # nothing changed
            assert (store.run(failed["run_id"])["status"], len(store.steps(failed["run_id"]))) == before
    data.write_text(original, encoding="utf-8")  # the file as it was: the run resumes
    code, out, err = invoke("replay", "--resume", failed["run_id"], "--yes", "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["status"] == "completed", err


def test_a_replay_whose_only_probe_is_an_abstention_says_why_nothing_is_scored(tmp_path) -> None:
    """A conversation whose one probe asks about something never said: the summary said nothing
    of it (neither a score nor why there was none)."""
    code, out, err = invoke("replay", "--dataset", str(PROJECT_DATASETS / "samples" / "longmemeval-sample.json"),
                            "--conversation", "omem-lme-004_abs", "--last-messages", "1",
                            "--observation-threshold", "20")
    assert code == 0, err
    assert "retention not scored: 1 probe, and it is about something never said (abstention), which only an " \
           "LLM judge grades (--judge and --answerer)" in " ".join(out.split())


def test_gold_answers_of_no_readable_word_are_not_called_missing(tmp_path) -> None:
    """Found in review: gold answers the word score cannot read ("はい" is a stop word) were
    reported as "none has a gold answer"."""
    lines = [json.loads(line) for line in (PROJECT_DATASETS / "tiny.jsonl").read_text().splitlines()]
    for line in lines:
        if line.get("type") == "probe":
            line["answer"] = "はい"
    path = tmp_path / "hai.jsonl"
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    code, out, err = invoke("replay", "--dataset", str(path), "--last-messages", "2", "--observation-threshold", "30")
    assert code == 0, err
    said = " ".join(out.split())
    assert "none has a gold answer" not in said
    assert "retention not scored: 3 probes, and no gold answer has words the word-retention score can look for" in said


def test_a_replays_dataset_warnings_name_their_conversation(tmp_path) -> None:
    """`replay` printed "warning: its question_date …" with no subject; `experiment run` names
    the conversation."""
    [instance] = json.loads((PROJECT_DATASETS / "samples" / "longmemeval-sample.json").read_text())[:1]
    instance["question_date"] = "2020/01/01 (Wed) 10:00"
    path = tmp_path / "early.json"
    path.write_text(json.dumps([instance]))
    code, out, err = invoke("replay", "--dataset", str(path), "--last-messages", "2")
    assert code == 0 and f"warning: {instance['question_id']}: its question_date (2020/01/01 (Wed) 10:00)" in err


def test_paid_work_starts_only_on_a_yes(scripted: Scripted, tmp_path) -> None:
    """A bare Enter at "Start? [Y/n]" started a paid run; a closed input printed only "Aborted!"."""
    args = ["replay", "--dataset", TINY, "--observer", "scripted/model", "--reflector", "none"]
    for answer in ("\n", ""):
        result = CliRunner().invoke(cli, args, input=answer, catch_exceptions=False)
        assert result.exit_code == 1 and "Start? [y/N]" in result.stderr
        assert "not started (pass --yes to start a paid replay without asking)" in result.stderr
    assert not scripted.calls
    with RunStore(tmp_path / "cli.duckdb") as store:
        assert store.runs().empty


def test_a_resumed_replay_quotes_the_cost_of_what_is_left(scripted: Scripted, tmp_path) -> None:
    """`replay --resume` asked before paying with the cost of the whole conversation, however
    little of it was left."""
    scripted.replies = ["- a", "- b", "- c", RuntimeError("rate limited")]
    with priced_scripted_model() as model:
        args = ["replay", "--dataset", str(DEMO_DATASET), "--observer", model, "--reflector", "none",
                "--observation-threshold", "300", "--no-cache", "--json"]
        declined = CliRunner().invoke(cli, args, input="n\n", catch_exceptions=False)
        whole = float(re.search(r"cost about \$([\d.]+)", declined.stderr).group(1))
        code, out, err = invoke(*args, "--yes")
        failed = json.loads(out.strip().splitlines()[-1])
        assert code == 1 and failed["status"] == "failed"
        with RunStore(tmp_path / "cli.duckdb") as store:
            observed = int(store.steps(failed["run_id"]).cursor_index.max())
        declined = CliRunner().invoke(cli, ["replay", "--resume", failed["run_id"]], input="n\n",
                                      catch_exceptions=False)
    assert declined.exit_code == 1 and "not started" in declined.stderr
    assert f"rest of run {failed['run_id']} ({200 - observed - 1} messages not yet observed)" in declined.stderr
    left = float(re.search(r"cost about \$([\d.]+)", declined.stderr).group(1))
    assert 0 < left < whole * (200 - observed) / 200 + 0.01  # the part left, not the whole conversation


def test_llm_judged_retention_through_litellm(scripted: Scripted, tmp_path) -> None:
    def answer(messages):
        prompt = messages[-1]["content"]
        if prompt.startswith("You grade answers"):
            return "CORRECT" if "Biscuit" in prompt.split("Candidate answer:")[1] else "WRONG"
        if "<messages>" in prompt:
            return "- noted"
        return "The dog is Biscuit." if "dog" in prompt else "I don't know"

    scripted.default = answer
    code, out, err = invoke("replay", "--dataset", TINY, *SMALL, "--answerer", "scripted/model", "--judge",
                            "scripted/model", "--yes", "--no-cache")
    assert code == 0, err
    assert "6 model calls" in err  # announced before starting: 3 probes x (answer + judge)
    assert "LLM-judged accuracy: 0.333 over 3 probes" in out
    with RunStore(tmp_path / "cli.duckdb") as store:
        run_id = store.runs().run_id[0]
        judged = store.probes(run_id).query("method == 'llm_judge'")
    assert len(judged) == 3 and judged.score.sum() == 1.0
    assert judged[judged.score == 1.0].answer.iloc[0] == "The dog is Biscuit."


def test_a_ctrl_c_at_the_judges_question_keeps_the_replay_and_says_so(scripted: Scripted, tmp_path) -> None:
    """Found by review: once a Ctrl-C at a question became an interrupt, one at the judge's "Run
    it?" (after the replay had completed and was recorded) said "interrupted before the command
    finished", and the --json line had no run id."""
    scripted.default = lambda messages: "- noted"
    result = CliRunner().invoke(cli, ["replay", "--dataset", TINY, *SMALL, "--answerer", "scripted/model", "--judge",
                                      "scripted/model", "--no-cache", "--json"], input=_CtrlC())
    assert result.exit_code == 130, result.output
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["status"] == "interrupted" and "nothing was judged" in last["error"]
    with RunStore(tmp_path / "cli.duckdb") as store:
        assert last["run_id"] == store.runs().run_id[0] and store.run(last["run_id"])["status"] == "completed"


def test_a_judge_that_names_no_verdict_is_said_not_scored_as_zero(scripted: Scripted, tmp_path) -> None:
    """Found by a researcher: a judge answering off script scored every probe 0 and printed
    "LLM-judged accuracy: 0.000", read as a measurement; `experiment show` likewise."""
    def answer(messages):
        prompt = messages[-1]["content"]
        if prompt.startswith("You grade answers"):
            return "I'd need more context to grade this."
        return "- noted" if "<messages>" in prompt else "The dog is Biscuit."

    scripted.default = answer
    code, out, err = invoke("replay", "--dataset", TINY, *SMALL, "--answerer", "scripted/model", "--judge",
                            "scripted/model", "--yes", "--no-cache")
    assert code == 0, err
    assert "LLM-judged accuracy: none over 0 probes" in out
    assert "warning: 3 judge replies named no verdict (neither CORRECT nor WRONG): those probes are not scored" in err
    code, out, err = invoke("experiment", "run", "--dataset", TINY, "--answerer", "scripted/model", "--judge",
                            "scripted/model", "--window", "2", "--concurrency", "1", "--yes", "--no-cache",
                            "--db", str(tmp_path / "x.duckdb"))
    assert code == 0, err
    said = " ".join(out.split())
    assert "LLM-judged accuracy: obs 1000 · ref 2000 · window 2 – (the cost includes" in said, said  # not 0.000
    assert "warning: 3 judge replies named no verdict" in said, said


def test_a_replays_judge_is_checked_before_the_replay_and_its_failure_is_said_cleanly(
        scripted: Scripted, tmp_path, monkeypatch) -> None:
    """A judge that could not be called was found only after the replay, and its failure ended
    in a traceback printing the API key its provider quoted (under --json, no JSON line)."""
    secret = "sk-test-SECRET1234567890"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    code, out, err = invoke("replay", "--dataset", TINY, *SMALL, "--answerer", "scripted/model", "--judge",
                            "nosuchprovider/judge", "--yes", "--json")
    assert code == 1 and "cannot judge here: nosuchprovider/judge" in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "failed"
    with RunStore(tmp_path / "cli.duckdb") as store:
        assert store.runs().empty  # refused before the replay: nothing recorded

    def answer(messages):
        prompt = messages[-1]["content"]
        if prompt.startswith("You grade answers"):
            raise RuntimeError(f"401: bad key Bearer {secret}")
        return "- noted" if "<messages>" in prompt else "The dog is Biscuit."

    scripted.default = answer
    code, out, err = invoke("replay", "--dataset", TINY, *SMALL, "--answerer", "scripted/model", "--judge",
                            "scripted/model", "--yes", "--no-cache", "--json")
    assert code == 1 and "the judge model scripted/model failed" in err and "Traceback" not in err
    assert secret not in out + err and "[OPENAI_API_KEY]" in err
    ending = json.loads(out.strip().splitlines()[-1])
    with RunStore(tmp_path / "cli.duckdb") as store:
        [run] = store.runs().to_dict("records")
    assert ending["status"] == "failed" and ending["run_id"] == run["run_id"] and run["status"] == "completed"
    assert ending["run"]["status"] == "completed" and ending["run"]["compression"] > 0  # its figures, not lost


def test_the_offline_model_is_refused_as_answerer_or_judge(tmp_path) -> None:
    """It summarises: as answerer it answered every question with notes, as judge it graded nothing
    correct, and the run read "LLM-judged accuracy: 0.000" (it also asked "Run it?" after the
    replay, and without a terminal ended failed). Refused before anything runs."""
    code, out, err = invoke("replay", "--dataset", str(PROJECT_DATASETS / "samples" / "longmemeval-sample.json"),
                            "--last-messages", "1", "--judge", "omem/extractive", "--answerer", "omem/extractive",
                            "--json")
    assert code == 1 and "omem/extractive is the built-in offline summariser: it cannot answer or grade" in err
    assert "Run it?" not in err
    with RunStore(tmp_path / "cli.duckdb") as store:
        assert store.runs().empty  # refused before the replay


def test_ctrl_c_while_judging_says_what_was_kept_and_puts_the_handler_back(scripted: Scripted, tmp_path) -> None:
    """A Ctrl-C during the LLM judge (after the replay) ended in click's "Aborted!" with exit code 1,
    and left Ctrl-C ignored in the calling process (a notebook, a test) for good."""
    import signal

    def answer(messages):
        prompt = messages[-1]["content"]
        if prompt.startswith("You grade answers"):
            signal.raise_signal(signal.SIGINT)  # pressed while the first answer is graded
            return "CORRECT"
        return "- noted" if "<messages>" in prompt else "The dog is Biscuit."

    scripted.default = answer
    before = signal.getsignal(signal.SIGINT)
    code, out, err = invoke("replay", "--dataset", TINY, *SMALL, "--answerer", "scripted/model", "--judge",
                            "scripted/model", "--yes", "--no-cache")
    assert signal.getsignal(signal.SIGINT) is before
    assert code == 130 and "Aborted" not in err, err
    with RunStore(tmp_path / "cli.duckdb") as store:
        [run] = store.runs().to_dict("records")
        assert run["status"] == "completed" and store.probes(run["run_id"]).query("method == 'llm_judge'").empty
    assert f"interrupted: no judged score was stored; run {run['run_id']} is kept as replayed" in err


def test_a_ctrl_c_just_after_a_replay_completed_does_not_ask_to_resume_it(tmp_path) -> None:
    """A Ctrl-C that lands as the run ends finds it completed: the command said "resume with" a
    run there was nothing left to resume of."""
    from workbench.cli import _new_run, _replay_interrupted

    code, out, _ = invoke("replay", "--dataset", TINY, *SMALL, "--json")
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
    with RunStore(tmp_path / "cli.duckdb") as store:
        assert _new_run(store, known=set()) == run_id  # found whatever its status (it looked for 'interrupted' only)
        said = _replay_interrupted(store, run_id)
        assert f"after run {run_id} had completed" in said and "resume" not in said
        store.update_run(run_id, status="interrupted")
        assert f"resume with: python -m workbench replay --resume {run_id}" in _replay_interrupted(store, run_id)


async def test_cancelled_replay_is_marked_interrupted_and_keeps_its_steps(scripted: Scripted, tmp_path) -> None:
    scripted.gate = asyncio.Event()
    conv = load_conversation(DEMO_DATASET)
    with RunStore(tmp_path / "i.duckdb") as store:
        task = asyncio.create_task(replay(conv, ReplayConfig(observer="scripted/model", reflector=None,
                                                             observation_threshold=300, cache=False), store))
        for _ in range(5000):
            if scripted.started:
                break
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run = store.runs().iloc[0]
        assert run.status == "interrupted" and "--resume" in run.error
        assert len(store.steps(run.run_id)) == int(run.steps) > 0


async def test_an_interrupted_run_counts_the_calls_it_made(scripted: Scripted, tmp_path) -> None:
    """Found in the app: a run interrupted after 47 calls read "Model calls 0 / 0" (its figures are
    written at a normal end only). Its calls, tokens and cost are counted from its recorded calls."""
    scripted.delay = 0.02
    conv = load_conversation(DEMO_DATASET)
    with RunStore(tmp_path / "i.duckdb") as store:
        task = asyncio.create_task(replay(conv, ReplayConfig(observer="scripted/model", reflector="scripted/model",
                                                             observation_threshold=100, reflection_threshold=150,
                                                             cache=False), store))
        for _ in range(5000):
            if len(scripted.calls) >= 4:
                break
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run = store.run(store.runs().run_id.iloc[0])
        calls = store.model_calls(run["run_id"])
        assert run["status"] == "interrupted" and len(calls) >= 4
        assert run["observer_calls"] == (calls.stage == "observe").sum() > 0
        assert run["reflector_calls"] == (calls.stage == "reflect").sum()
        assert run["input_tokens"] == 11 * len(calls) and run["output_tokens"] == 7 * len(calls)
        assert store.runs().input_tokens.dtype.kind == "i"  # whole numbers, not floats (DuckDB's HUGEINT sum)
        assert store.runs().iloc[0].observer_calls == run["observer_calls"]  # the list reads the same
        # Compare shows its compression as the explorer does: the ratio at its last read, partial
        from workbench.analysis import compare_runs
        from workbench.formatting import ratio

        last = store.steps(run["run_id"]).iloc[-1]
        shown = compare_runs(store, run["run_id"], run["run_id"]).loc["compression (x)"].iloc[0]
        assert shown == ratio(last.history_tokens / last.context_tokens, partial=True) and "partial" in shown


def test_a_database_held_too_long_gets_a_clear_message(tmp_path, monkeypatch) -> None:
    path = tmp_path / "held.duckdb"
    RunStore(path).close()
    monkeypatch.setenv("OMEM_DB_WAIT", "1")
    with held_by_another_process(path):
        code, _, err = invoke("runs", "--db", str(path))
    assert code == 1 and "waiting for" in err  # it waited first, and said so
    assert "is open in another process" in err and "stayed busy for 1 s" in err and "--db" in err


def test_module_entry_point_help() -> None:
    out = subprocess.run([sys.executable, "-m", "workbench", "--help"], capture_output=True, text=True, check=True)
    for command in ("replay", "sweep", "compare", "runs", "export", "app", "datasets"):
        assert command in out.stdout


def test_the_threshold_help_states_the_workbenchs_limit() -> None:
    # (the help is written out so the quick CLI path does not import omem_core for the constant)
    from workbench.replay import OBSERVER_INPUT_CAP

    code, out, _ = invoke("replay", "--help")
    assert code == 0 and f"at most {OBSERVER_INPUT_CAP:,} here" in " ".join(out.split())


def test_the_replay_summary_says_which_probes_were_not_scored_and_fits_a_terminal(tmp_path) -> None:
    code, out, _ = invoke("replay", "--dataset", str(PROJECT_DATASETS / "samples" / "beam-sample"),
                          "--last-messages", "2", "--db", str(tmp_path / "r.duckdb"), "--no-cache")
    assert code == 0
    assert "over 2 probes (not scored: 1 without a gold answer)" in out  # the dataset lists 3
    assert "the same questions on: full history" in out
    assert out.splitlines()[0].endswith(" · conversation beam-beam-sample of beam-sample")  # what was replayed
    context = re.search(r"final context (\d+) tokens", out).group(1)
    assert f"newest {context} tokens" in out  # the recency baseline's size, not an unexplained "K"
    assert max(len(line) for line in out.splitlines()) <= 100
    # in the default window of 10 messages, all 6 of this chat's messages are still in view
    code, out, _ = invoke("replay", "--dataset", str(PROJECT_DATASETS / "samples" / "beam-sample"),
                          "--db", str(tmp_path / "r.duckdb"), "--no-cache")
    assert code == 0 and "retention not scored: the evidence of 2 probes is still in the final window" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_run_another_live_process_is_replaying_is_neither_resumed_nor_deleted(tmp_path) -> None:
    """Resuming (or deleting) a run that a live process of this host is still replaying would make
    two writers of one run (duplicate-key crashes, a live run marked interrupted) or leave its rows
    orphaned: both are refused with who holds it, and nothing is changed. Once that process is
    gone, the run is interrupted and both work."""
    import socket

    from workbench.runstore import RunBusy, process_token

    db = str(tmp_path / "busy.duckdb")
    code, out, _ = invoke("replay", "--dataset", TINY, *SMALL, "--json", "--db", db)
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with RunStore(db) as store:  # the run as a replay in that process leaves it while it runs
            with store.session() as cur:
                cur.execute("UPDATE runs SET status = 'running', owner_host = ?, owner_pid = ?, owner_token = ? "
                            "WHERE run_id = ?", [socket.gethostname(), other.pid, process_token(other.pid), run_id])
            steps = len(store.steps(run_id))
        code, _, err = invoke("replay", "--resume", run_id, "--db", db)
        assert code == 1 and f"still running in process {other.pid}" in err
        with RunStore(db) as store:
            with pytest.raises(RunBusy, match=f"being replayed by process {other.pid}"):
                store.delete_run(run_id)
            assert store.run(run_id)["status"] == "running" and len(store.steps(run_id)) == steps
    finally:
        other.kill()
        other.wait()
    with RunStore(db) as store:  # its owner gone: interrupted on this open, then resumable
        assert store.run(run_id)["status"] == "interrupted"
    code, _, err = invoke("replay", "--resume", run_id, "--db", db)
    assert code == 0, err
    with RunStore(db) as store:
        assert store.run(run_id)["status"] == "completed"
        store.delete_run(run_id)
        assert store.runs().empty


async def test_a_run_deleted_while_it_is_replayed_stops_and_leaves_nothing_behind(tmp_path) -> None:
    """Deleted mid-replay (another session of the app, in this process): the replay stops with an
    error that says so, instead of writing steps, probes and calls of a run that no longer exists
    and calling it completed."""
    from workbench.runstore import RUN_TABLES, RunDeleted

    with RunStore(tmp_path / "gone.duckdb") as store:
        conv = load_conversation(DEMO_DATASET)
        run_ids = []

        def progress(done: int, total: int, message: str) -> None:
            runs = store.runs()
            if done >= 60 and not run_ids and not runs.empty:
                run_ids.append(runs.run_id[0])
                store.delete_run(run_ids[0])

        with pytest.raises(RunDeleted, match="was deleted .* while it was being replayed"):
            await replay(conv, ReplayConfig(observation_threshold=150, reflection_threshold=600, cache=False),
                         store, progress=progress, flush_every=5)  # written as it goes, as a slow replay is
        with store.session() as cur:
            left = {t: cur.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", run_ids).fetchall()[0][0]
                    for t in RUN_TABLES}
        assert run_ids and set(left.values()) == {0}, left


def test_a_dataset_given_relative_is_recorded_absolute_and_resumes_from_elsewhere(tmp_path, monkeypatch) -> None:
    """`--dataset datasets/tiny.jsonl` was recorded as given: a resume started in another folder
    could not find it, and the app (which names datasets absolutely) took the run for another
    conversation's."""
    import os
    from pathlib import Path

    db = str(tmp_path / "rel.duckdb")
    monkeypatch.chdir(Path(TINY).parents[1])
    code, out, err = invoke("replay", "--dataset", "datasets/tiny.jsonl", *SMALL, "--json", "--db", db)
    assert code == 0, err
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
    with RunStore(db) as store:
        assert store.run(run_id)["dataset"] == os.path.abspath(TINY)
        store.set_status(run_id, "interrupted", "stopped for the test")
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("replay", "--resume", run_id, "--db", db)
    assert code == 0, err


@pytest.mark.parametrize("args, error", [
    (["--observation-threshold", "20000"], "observation_threshold must be at most 16,000 tokens"),
    (["--timeout", "0"], "Invalid value for '--timeout'"),
    (["--timeout", "-1"], "Invalid value for '--timeout'"),
    (["--timeout", "inf"], "timeout must be a positive number of seconds"),
])
def test_a_configuration_that_cannot_run_is_refused_before_any_run_is_recorded(tmp_path, args, error) -> None:
    db = str(tmp_path / "refused.duckdb")
    code, _, err = invoke("replay", "--dataset", TINY, *args, "--db", db)
    assert code == 2 and error in " ".join(err.split())  # a refused option (the README's exit 2)
    code, _, err = invoke("experiment", "run", "--dataset", TINY, *args, "--db", db)
    assert code == 2 and error in " ".join(err.split())
    with RunStore(db) as store:
        assert store.runs().empty and store.experiments().empty  # no failed run left behind to explain


def test_ctrl_c_names_the_run_to_resume_and_leaves_no_warning_noise(tmp_path) -> None:
    """A real SIGINT to `replay` (not a cancelled task): the hint names the interrupted run, and the
    model calls cancelled before they started are not reported as 'never awaited' coroutines."""
    import os
    import signal

    from workbench.catalog import ROOT

    db = tmp_path / "ctrl-c.duckdb"
    worker = subprocess.Popen(
        [sys.executable, "-m", "workbench", "replay", "--dataset", str(DEMO_DATASET), "--db", str(db), "--no-cache",
         "--recall-on", "every", "--observation-threshold", "40", "--reflection-threshold", "80"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=0,
        env={**os.environ, "OMEM_CACHE_DIR": str(tmp_path / "cache")})
    seen = ""
    while "0% (1/200" not in seen:  # the replay has started: interrupt it mid-way
        char = worker.stderr.read(1)
        assert char, f"the replay ended before it could be interrupted: {seen}"
        seen += char
    worker.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 120
    while worker.poll() is None and time.monotonic() < deadline:  # Ctrl-C held down: no traceback either
        time.sleep(0.002)
        with contextlib.suppress(ProcessLookupError):
            worker.send_signal(signal.SIGINT)
    err = seen + worker.stderr.read()
    # (130, or killed by the signal itself once Python's shutdown has put the default handler back)
    assert worker.wait(timeout=120) in (130, -signal.SIGINT), err
    with RunStore(db) as store:
        [run] = store.runs().to_dict("records")  # the run's last write was not stopped half-way
    assert run["status"] == "interrupted"
    assert f"resume with: python -m workbench replay --resume {run['run_id']} --db {db}\n" in err
    assert "never awaited" not in err and "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_ctrl_c_during_a_sweep_names_the_runs_to_resume(tmp_path) -> None:
    """Found by a researcher: an interrupted sweep said only "finished runs are kept", not which
    runs it left interrupted nor how to finish them (`replay` and `experiment` say both)."""
    import os
    import signal

    from workbench.catalog import ROOT

    db = tmp_path / "sweep.duckdb"
    long = tmp_path / "long.jsonl"  # (runs of seconds each, however fast the machine: the second is caught)
    long.write_text("".join(json.dumps({"type": "message", "conversation_id": "long", "id": f"m{i}",
                                        "role": ("user", "assistant")[i % 2],
                                        "content": f"Message {i}: the fact number {i} is worth keeping here.",
                                        "timestamp": f"2024-01-{1 + i // 1440:02d}T{i // 60 % 24:02d}:{i % 60:02d}:00Z"})
                            + "\n" for i in range(3000)))
    worker = subprocess.Popen(
        [sys.executable, "-m", "workbench", "sweep", "--dataset", str(long), "--db", str(db),
         "--observation-threshold", "40,60,80", "--reflection-threshold", "400", "--concurrency", "1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=0,
        env={**os.environ, "OMEM_CACHE_DIR": str(tmp_path / "cache")})
    seen = ""
    while "[1/3]" not in seen:  # the first run is done and the second under way: interrupt it
        char = worker.stderr.read(1)
        assert char, f"the sweep ended before it could be interrupted: {seen}"
        seen += char
    time.sleep(1.0)  # (the second run under way)
    worker.send_signal(signal.SIGINT)
    err = seen + worker.stderr.read()
    assert worker.wait(timeout=120) in (130, -signal.SIGINT), err
    with RunStore(db) as store:
        runs = store.runs()
    cut = runs[runs.status != "completed"]
    assert len(cut) >= 1 and (runs.status == "completed").sum() >= 1, runs[["run_id", "status"]]
    commands = "; ".join(f"python -m workbench replay --resume {r} --db {db}" for r in cut.run_id)
    assert (f"interrupted: finished runs are kept; {len(cut)} run{'s' if len(cut) > 1 else ''} did not finish: "
            f"resume {'each' if len(cut) > 1 else 'it'} with: {commands}") in " ".join(err.split()), err


def test_a_conversation_id_with_control_characters_prints_on_one_line(tmp_path) -> None:
    """Found by a researcher: an id holding a newline or a right-to-left override scrambled the
    replay's summary (the runs table escaped it)."""
    data = tmp_path / "odd.jsonl"
    data.write_text(json.dumps({"type": "message", "conversation_id": "two\nlines\u202eevil", "id": "m1", "role": "user",
                                "content": "hello there", "timestamp": "2024-01-02T10:00:00Z"}) + "\n")
    code, out, err = invoke("replay", "--dataset", str(data), "--db", str(tmp_path / "o.duckdb"))
    assert code == 0, err
    assert "· conversation two\\nlines\\u202eevil of " in out.splitlines()[0]
    assert "\u202e" not in out + err


def test_the_window_and_the_name_have_the_same_options_on_every_command(tmp_path) -> None:
    """`replay`/`sweep` called the window --last-messages and `experiment run` --window (and a run's
    name --label, an experiment's --name): options copied from one command to another failed."""
    db = str(tmp_path / "o.duckdb")
    code, out, err = invoke("replay", "--dataset", TINY, "--window", "3", "--name", "w3", "--json", "--db", db)
    assert code == 0, err
    code, out, err = invoke("experiment", "run", "--dataset", TINY, "--last-messages", "3", "--label", "e3",
                            "--concurrency", "1", "--json", "--db", db)
    assert code == 0, err
    with RunStore(db) as store:
        runs = store.runs()
        assert set(runs.label.dropna()) >= {"w3"} and store.experiments().name.tolist() == ["e3"]
        assert {store.run(r)["config"]["last_messages"] for r in runs.run_id} == {3}


def test_compare_names_each_run_s_conversation_as_a_and_b(tmp_path) -> None:
    """The warning listed the two conversations sorted, so it read the wrong way round half the time."""
    db = str(tmp_path / "c.duckdb")
    ids = []
    for dataset in (str(DEMO_DATASET), TINY):
        code, out, _ = invoke("replay", "--dataset", dataset, "--json", "--db", db)
        ids.append(json.loads(out.strip().splitlines()[-1])["run_id"])
    with RunStore(db) as store:
        a, b = (store.run(r)["conversation_id"] for r in ids)
    assert a != b
    for first, second, names in ((ids[0], ids[1], (a, b)), (ids[1], ids[0], (b, a))):
        code, _, err = invoke("compare", first, second, "--db", db)
        assert code == 0 and f"different conversations (A {names[0]}, B {names[1]})" in err, err


class _CtrlC(io.RawIOBase):
    """A terminal whose user presses Ctrl-C at the first question."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if len(buffer):
            raise KeyboardInterrupt
        return 0


def test_the_model_call_cache_is_shown_and_cleared(tmp_path, monkeypatch) -> None:
    """The cache only grows (answers of every model and omem version are kept) and nothing said
    where it was or how large, nor emptied it: `cache` says both, `cache --clear` empties it."""
    calls = tmp_path / "calls?#50%"  # (characters a file: URI would read as its own)
    monkeypatch.setenv("OMEM_CACHE_DIR", str(calls))
    db = str(tmp_path / "r.duckdb")
    code, out, _ = invoke("cache")
    assert code == 0 and out.strip() == f"no model-call cache at {calls / 'litellm-cache.sqlite'} yet"
    assert invoke("replay", "--db", db)[0] == 0  # the demo: three observer calls, cached
    code, out, err = invoke("cache")
    assert code == 0 and out.startswith(f"model-call cache {calls / 'litellm-cache.sqlite'}: 3 answers, "), err
    result = CliRunner().invoke(cli, ["cache", "--clear"], input="n\n")
    assert result.exit_code == 1 and "nothing deleted" in result.stderr
    assert " 3 answers, " in invoke("cache")[1]
    code, out, _ = invoke("cache", "--clear", "--yes")
    assert code == 0 and "deleted 3 cached answers" in out
    assert ": 0 answers, " in invoke("cache")[1]
    code, out, _ = invoke("cache", "--clear")  # an empty cache: no question
    assert code == 0 and ": 0 answers, " in out and "deleted" not in out
    code, out, _ = invoke("replay", "--db", db, "--json")
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["cache_hits"] == 0  # asked the model again


def test_runs_and_experiments_are_deleted_from_the_cli_after_a_confirmation(tmp_path) -> None:
    db = str(tmp_path / "d.duckdb")
    ids = []
    for threshold in ("40", "60"):
        code, out, _ = invoke("replay", "--dataset", TINY, "--observation-threshold", threshold, "--json", "--db", db)
        ids.append(json.loads(out.strip().splitlines()[-1])["run_id"])
    code, out, _ = invoke("experiment", "run", "--dataset", TINY, "--observation-threshold", "40,60",
                          "--concurrency", "1", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]

    result = CliRunner().invoke(cli, ["delete", ids[0], "--db", db], input="n\n")
    assert result.exit_code == 1 and f"run {ids[0]}: completed, conversation" in result.stderr
    assert "nothing deleted (pass --yes" in result.stderr and "Aborted!" not in result.output
    result = CliRunner().invoke(cli, ["delete", ids[0], "--db", db], input="\n")  # Enter is no
    assert result.exit_code == 1 and "nothing deleted" in result.stderr
    # a Ctrl-C at the question is an interrupt (exit 130, as the README says), not a "no" (it exited 1)
    result = CliRunner().invoke(cli, ["delete", ids[0], "--db", db], input=_CtrlC())
    assert result.exit_code == 130 and "interrupted" in result.stderr and "Aborted!" not in result.output
    result = CliRunner().invoke(cli, ["experiment", "delete", experiment_id, "--db", db], input=_CtrlC())
    assert result.exit_code == 130 and "interrupted" in result.stderr
    code, _, err = invoke("delete", ids[0], "no-such-run", "--yes", "--db", db)
    assert code == 1 and "no-such-run" in err  # an unknown id: nothing is deleted, not even the known one
    with RunStore(db) as store:
        assert len(store.runs()) == 4
    result = CliRunner().invoke(cli, ["delete", ids[0], "--db", db], input="y\n")
    assert result.exit_code == 0 and f"deleted run {ids[0]}" in result.stdout
    with RunStore(db) as store:
        assert set(store.runs().run_id) >= {ids[1]} and ids[0] not in set(store.runs().run_id)

    result = CliRunner().invoke(cli, ["experiment", "delete", experiment_id, "--db", db], input="n\n")
    assert result.exit_code == 1 and "2 runs recorded" in result.stderr and "nothing deleted" in result.stderr
    code, out, _ = invoke("experiment", "delete", experiment_id, "--yes", "--db", db)
    assert code == 0 and f"deleted experiment {experiment_id} and 2 runs" in out
    with RunStore(db) as store:
        assert store.experiments().empty and list(store.runs().run_id) == [ids[1]]


def test_a_delete_that_fails_midway_deletes_nothing(tmp_path, monkeypatch) -> None:
    """A run's rows live in seven tables; a delete that fails after some of them (here: the
    process is interrupted between `messages` and `runs`) is rolled back whole, run and experiment."""
    import workbench.runstore as runstore

    class Interrupted(Exception):
        pass

    class FailingTables:  # the tables to delete from, and an interruption before the last one
        def __iter__(self):
            yield from runstore_tables[:-1]
            raise Interrupted("stopped between two tables")

    runstore_tables = runstore.RUN_TABLES

    db = str(tmp_path / "rb.duckdb")
    code, out, _ = invoke("experiment", "run", "--dataset", TINY, "--observation-threshold", "40", "--window", "2",
                          "--concurrency", "1", "--json", "--db", db)
    experiment_id = json.loads(out.strip().splitlines()[-1])["experiment_id"]
    with RunStore(db) as store:
        [run_id] = store.experiment_runs(experiment_id).run_id
        before = {table: len(store._df(f"SELECT * FROM {table}")) for table in runstore.RUN_TABLES}
    assert all(before.values())
    monkeypatch.setattr(runstore, "RUN_TABLES", FailingTables())
    with RunStore(db) as store:
        for delete, key in ((store.delete_run, run_id), (store.delete_experiment, experiment_id)):
            with pytest.raises(Interrupted):
                delete(key)
            after = {table: len(store._df(f"SELECT * FROM {table}")) for table in before}
            assert after == before and len(store.experiments()) == 1


def test_a_wrapped_line_never_splits_an_interval(capsys) -> None:
    from workbench.cli import _echo_wrapped

    for pad in range(28, 40):  # the intervals straddle the 100th column at some pad
        _echo_wrapped("y " * pad + "obs 500 keeps 0.018 more [0.006, 0.031] and [-0.295, +0.045]")
        out = capsys.readouterr().out
        assert "[0.006, 0.031]" in out and "[-0.295, +0.045]" in out and max(map(len, out.splitlines())) <= 100


def test_a_hint_names_the_run_store_unless_it_is_the_default_everywhere(monkeypatch) -> None:
    from workbench.formatting import cli_command

    monkeypatch.delenv("OMEM_DB", raising=False)
    assert cli_command("runs", "runs.duckdb") == "python -m workbench runs"
    assert cli_command("runs", "/tmp/my runs.duckdb") == "python -m workbench runs --db '/tmp/my runs.duckdb'"
    # --db runs.duckdb given while OMEM_DB names another file: without --db the hint would read that one
    monkeypatch.setenv("OMEM_DB", "other.duckdb")
    assert cli_command("runs", "runs.duckdb") == "python -m workbench runs --db runs.duckdb"


def test_runs_of_one_experiment_are_listed_apart_from_another_s(tmp_path) -> None:
    """Found by a newcomer: with two experiments in one store, `runs` listed "obs 20" twice per
    conversation (labels name what varies within an experiment) with nothing to tell them apart."""
    db = str(tmp_path / "r.duckdb")
    ids = []
    for reflection in ("60", "80"):
        code, out, err = invoke("experiment", "run", "--dataset", TINY, "--observation-threshold", "20,40",
                                "--reflection-threshold", reflection, "--window", "2", "--json", "--db", db)
        assert code == 0, err
        ids.append(json.loads(out.strip().splitlines()[-1])["experiment_id"])
    code, out, _ = invoke("runs", "--db", db)
    assert code == 0 and out.strip().endswith("(runs of 2 experiments: `runs --experiment ID` lists one's, "
                                              "`experiment list` names them)")
    with RunStore(db) as store:
        mine = set(store.experiment_runs(ids[0]).run_id)
    code, out, _ = invoke("runs", "--experiment", ids[0], "--db", db)
    listed = {line.split()[0] for line in out.strip().splitlines()[1:]}
    assert code == 0 and listed == mine and "experiments:" not in out
    code, out, _ = invoke("runs", "--experiment", ids[0], "--json", "--db", db)
    assert {row["run_id"] for row in json.loads(out)} == mine
    code, _, err = invoke("runs", "--experiment", "exp-nope", "--db", db)
    assert code == 1 and "no experiment exp-nope in" in err


def test_an_empty_run_store_path_is_refused_and_an_empty_omem_db_is_unset(tmp_path, monkeypatch) -> None:
    """Found by fuzzing: `--db ""` (or `OMEM_DB=` set empty) opened a DuckDB in memory with no
    tables, and replay, sweep and experiment run crashed with "Table with name runs does not
    exist!"."""
    for args in (("replay", *SMALL), ("experiment", "run", "--name", "e", "--observation-threshold", "40"), ("runs",)):
        code, _, err = invoke(*args, "--dataset", TINY, "--db", "") if args[0] != "runs" else invoke("runs", "--db", "")
        assert code == 2 and "'--db': empty: name the run store's file" in err and "Traceback" not in err, (args, err)
    with pytest.raises(RunStoreError, match="the run store's path is empty"):  # the library's own refusal
        RunStore("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMEM_DB", "")  # as unset: the default file, here
    code, out, err = invoke("replay", "--dataset", TINY, *SMALL, "--json")
    assert code == 0, err
    with RunStore(tmp_path / "runs.duckdb") as store:
        assert list(store.runs().run_id) == [json.loads(out.strip().splitlines()[-1])["run_id"]]


@pytest.mark.parametrize("args", [("replay", "--dataset", "/tmp/t\udcff.jsonl"), ("replay", "--label", "\udcff"),
                                  ("replay", "--reflector", "\udcff"), ("experiment", "run", "--name", "\udcff"),
                                  ("experiment", "show", "\udcff"), ("runs", "--experiment", "\udcff"),
                                  ("compare", "\udcff", "b"), ("replay", "--observer-prompt", "\udcff"),
                                  ("replay", "--db", "/tmp/r\udcff.duckdb"), ("replay", "--label", "half \ud83d")])
def test_arguments_that_are_not_utf8_are_refused_up_front(args) -> None:
    """Found by fuzzing: bytes that are not UTF-8 in an argument (a file named in Latin-1, a label)
    reach Python as lone surrogates, and DuckDB refused them with its own error (or
    `std::bad_cast` for the store's path) after the replay had run."""
    code, out, err = invoke(*args, "--json")
    assert code == 2 and "is not UTF-8 text" in err and ("\\xff" in err or "\\ud83d" in err) and "Traceback" not in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "failed"


def test_datasets_lists_a_file_whose_name_is_not_utf8(tmp_path) -> None:
    """`datasets` writes nothing to the run store: a file named in Latin-1 is listed (the check
    of the commands that do refused it)."""
    import os

    path = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.jsonl"))
    path.write_bytes(Path(TINY).read_bytes())
    code, out, err = invoke("datasets", str(path), "--json")
    assert code == 0, err
    [entry] = json.loads(out)
    assert entry["conversations"] == 1 and entry["messages"] == 12


def test_an_empty_export_folder_is_refused(tmp_path, monkeypatch) -> None:
    """Found by fuzzing: `export --parquet ""` wrote its files into the current folder."""
    monkeypatch.chdir(tmp_path)
    for args in (("export", "r1", "--parquet", ""), ("experiment", "export", "e1", "--parquet", "")):
        code, _, err = invoke(*args)
        assert code == 2 and "'--parquet': empty: name a folder" in err, err
    assert list(tmp_path.iterdir()) == []


def test_experiment_show_says_why_an_experiment_stopped(tmp_path) -> None:
    """Found by a new user: an experiment recorded as failed (a BrokenPipeError) showed "(failed)"
    and a resume hint, never the error recorded with it; `show --json` had no error either."""
    from workbench import experiments as ex

    db = tmp_path / "r.duckdb"
    with RunStore(db) as store:
        experiment_id = ex.create_experiment(store, dataset=TINY, grid=[ReplayConfig()],
                                             options=ex.ExperimentOptions(concurrency=1))
        store.finish_experiment(experiment_id, "failed", "OSError: [Errno 28] No space left on device", 1.5)
    code, out, err = invoke("experiment", "show", experiment_id, "--db", str(db))
    assert "failed: OSError: [Errno 28] No space left on device" in out + err, out + err
    code, out, _ = invoke("experiment", "show", experiment_id, "--db", str(db), "--json")
    assert json.loads(out.strip().splitlines()[-1])["error"] == "OSError: [Errno 28] No space left on device"
