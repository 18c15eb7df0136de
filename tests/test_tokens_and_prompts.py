"""Token counting offline, prompt versions, and the pinned public API."""

from __future__ import annotations

import subprocess
import sys

import pytest

import omem_core
from omem_core import OBSERVER_PROMPT, REFLECTOR_PROMPT, Prompt, count_tokens, token_counter
from omem_core.prompts import render_observer_input, render_reflector_input

from conftest import msg

SPEC_NAMES = {
    "Message", "MemoryStore", "InMemoryMemoryStore", "Memory", "ObservationRecord", "ObservationStore",
    "create_in_memory_observation_store", "CompactionError", "create_observational_memory_store",
}


def test_public_api_is_pinned() -> None:
    assert SPEC_NAMES <= set(omem_core.__all__)
    assert omem_core.__all__ == sorted(omem_core.__all__, key=lambda n: (not n.isupper(), n))
    for name in omem_core.__all__:
        assert getattr(omem_core, name) is not None


def test_core_imports_neither_streamlit_nor_duckdb() -> None:
    code = "import sys, omem_core; print(sorted(m for m in ('streamlit', 'duckdb', 'pandas', 'workbench') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("encoding, expected", [("o200k_base", [2, 1]), ("cl100k_base", [2, 1])])
def test_count_tokens_offline(encoding: str, expected: list[int]) -> None:
    assert count_tokens(["hello world", "x"], encoding=encoding) == expected
    # special-token text is counted as plain text, not rejected
    assert count_tokens(["<|endoftext|>"], encoding=encoding)[0] > 1
    assert count_tokens([], encoding=encoding) == []


def test_token_counter_factory() -> None:
    assert token_counter("heuristic")(["abcde"]) == [2]
    assert token_counter("o200k_base")(["hello world"]) == [2]
    with pytest.raises(ValueError, match="unknown encoding 'gpt2'"):
        token_counter("gpt2")


def test_prompts_are_versioned_with_a_hash() -> None:
    assert OBSERVER_PROMPT.version == "v2" and REFLECTOR_PROMPT.version == "v2"
    assert len(OBSERVER_PROMPT.sha256) == 64
    assert Prompt("observer", "v2", OBSERVER_PROMPT.text + "!").sha256 != OBSERVER_PROMPT.sha256
    with pytest.raises(ValueError, match="empty"):
        Prompt("observer", "v0", "  ")
    from omem_core.prompts import BUILTIN_PROMPTS

    assert BUILTIN_PROMPTS["observer"][0] is OBSERVER_PROMPT and BUILTIN_PROMPTS["reflector"][0] is REFLECTOR_PROMPT
    for name, versions in BUILTIN_PROMPTS.items():
        assert len({p.version for p in versions}) == len({p.sha256 for p in versions}) == len(versions)
        for prompt in versions:
            assert prompt.name == name
            assert count_tokens([prompt.text])[0] < 600  # size budget for a system prompt
    for prompt in (OBSERVER_PROMPT, REFLECTOR_PROMPT):  # what the default notes must hold
        for rule in ("date heading", "exactly", "Resolve relative dates" if prompt is OBSERVER_PROMPT else "newest"):
            assert rule in prompt.text


def test_a_prompt_or_call_option_of_the_wrong_kind_is_refused_with_its_name() -> None:
    """Found by fuzzing: `Prompt(text=5)` was an AttributeError ('int' object has no attribute
    'strip'), a lone surrogate a raw UnicodeEncodeError; `completion_kwargs=5` was "'int' object is
    not iterable", `{1: 2}` was accepted and failed every pass; `source_ids="abc"` became
    ('a', 'b', 'c')."""
    from datetime import datetime, timezone

    from omem_core import ObservationRecord, create_observational_memory_store

    for text, error in ((5, TypeError), (None, TypeError), (["a"], TypeError), (b"notes", TypeError),
                        ("notes \ud800", ValueError)):
        with pytest.raises(error, match=r"prompt 'observer': text (must be a str|is not valid Unicode)"):
            Prompt("observer", "v9", text)
    with pytest.raises(TypeError, match="prompt 7: name must be a str"):
        Prompt(7, "v9", "Take notes.")
    with pytest.raises(ValueError, match="text is not valid Unicode"):
        create_observational_memory_store(observer="omem/extractive", observer_prompt="notes \ud800")
    for bad in (5, "abc", {1: 2}):
        with pytest.raises(TypeError, match="completion_kwargs must be a mapping of litellm argument names"):
            create_observational_memory_store(observer="omem/extractive", completion_kwargs=bad)
    assert create_observational_memory_store(observer="omem/extractive", completion_kwargs={"temperature": 0})
    with pytest.raises(TypeError, match="record 'r1': source_ids must be a sequence of ids, got a str"):
        ObservationRecord("r1", "t", None, datetime(2024, 1, 1, tzinfo=timezone.utc), "observation", "abc", "x")
    assert ObservationRecord("r1", "t", None, datetime(2024, 1, 1, tzinfo=timezone.utc), "observation",
                             ["m1", "m2"], "x").source_ids == ("m1", "m2")


def test_observer_input_renders_timestamps_and_speakers() -> None:
    text = render_observer_input([msg(0, "Ann: hi\nthere"), msg(1, "ok", role="assistant")], target_tokens=99)
    assert text.splitlines()[1] == "[2024-03-01 09:00 Fri] user: Ann: hi / there"
    assert text.splitlines()[2] == "[2024-03-01 09:01 Fri] assistant: ok"
    assert text.endswith("Target length: at most 99 tokens.")
    assert "<reflection>\n\n</reflection>" in render_reflector_input(None, [], target_tokens=5)


def test_reflector_target_is_half_its_input_capped_by_the_threshold() -> None:
    from omem_core.planning import reflector_target_tokens

    assert reflector_target_tokens(2000, 2400) == 1320  # 55% of reflection + new observations
    assert reflector_target_tokens(2000, 9000) == 2000  # never above the threshold
    assert reflector_target_tokens(2000, 10) == 48  # a floor for tiny inputs...
    assert reflector_target_tokens(20, 10) == 20  # ...that the threshold still caps


def test_a_revision_names_a_missing_edit() -> None:
    from omem_core.prompts import OBSERVER_PROMPT_V1, revised

    assert revised(OBSERVER_PROMPT_V1, "v9", ("observer", "watcher")).text.startswith("You are the watcher")
    with pytest.raises(ValueError, match="observer@v1: 'no such words' is not in the text"):
        revised(OBSERVER_PROMPT_V1, "v9", ("no such words", "x"))


def test_tighten_input_sends_the_draft_back_with_a_stronger_target() -> None:
    from omem_core.prompts import render_tighten_input

    text = render_tighten_input("- a\n- b", draft_tokens=30, limit_tokens=20, target_tokens=16)
    assert text.startswith("Your reflection was 30 tokens; it must fit in 20.")
    assert "<observations>\n- a\n- b\n</observations>" in text
    assert text.endswith("Target length: at most 16 tokens.")


def test_the_event_fields_named_in_the_concepts_page_are_the_dataclass_fields() -> None:
    """The page listed a `cost` field; the field is `cost_usd` (`e.cost` raised AttributeError)."""
    import dataclasses
    import re
    from pathlib import Path

    from omem_core import CompactionEvent

    page = (Path(__file__).resolve().parents[1] / "docs" / "concepts.md").read_text()
    bullet = page.split("- `on_event(CompactionEvent)`", 1)[1].split("\n- ", 1)[0]
    named = set(re.findall(r"`([a-z_0-9]+)`", bullet))
    fields = {f.name for f in dataclasses.fields(CompactionEvent)}
    assert named and named <= fields, named - fields
    assert fields - named == set(), fields - named  # and every field is described


def test_a_cache_folder_of_the_users_own_still_counts_offline(tmp_path) -> None:
    """With TIKTOKEN_CACHE_DIR set to a folder of the user's (without the encodings), tiktoken
    tried to download them and failed offline after seconds: "could not load 'o200k_base' offline
    ... is litellm installed?". The encodings litellm bundles are read instead; the variable is left
    as the user set it."""
    import os

    mine = tmp_path / "my-cache"
    mine.mkdir()
    code = ("import os; from omem_core import token_counter; "
            "print(token_counter('o200k_base')(['hello world']), token_counter('cl100k_base')(['hello world']), "
            "os.environ['TIKTOKEN_CACHE_DIR'])")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(mine), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}  # (no download can succeed)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[2]", "[2]", str(mine)]
