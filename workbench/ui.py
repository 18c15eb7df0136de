"""Streamlit helpers shared by the app's pages: the store, run pickers, the config form.

Display only: data comes from :mod:`workbench.runstore` and :mod:`workbench.analysis`. Dataset and
model text is always shown as text (``st.code``/``st.text``/dataframes), never as HTML.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

from omem_core import Prompt
from omem_core.prompts import BUILTIN_PROMPTS

from .catalog import DEMO_DATASET, known_datasets
from .datasets import Conversation, DatasetError, load_dataset
from .models import model_status, usable_models
from .replay import TOKEN_COUNTERS, ReplayConfig, ReplayFailed, ReplayResult, replay
from .runstore import RunStore, RunStoreError, RunStoreLocked

RUN_KEY = "omem_run"  # the run opened across pages
UPLOAD = "Upload a file…"
DEMO_THRESHOLDS = (300, 600)  # the demo chat is ~3.6k tokens: scaled so every stage shows


def db_path() -> str:
    return os.environ.get("OMEM_DB", "runs.duckdb")


@st.cache_resource(show_spinner=False)
def _open_store(path: str) -> tuple[RunStore, str | None]:
    try:
        return RunStore(path), None
    except RunStoreLocked as exc:
        # Another process (a CLI sweep, another app) writes the file: show a snapshot of it.
        try:
            return RunStore.snapshot(path), str(exc)
        except (OSError, RunStoreError):
            raise exc from None


def get_store() -> RunStore:
    """The process's one connection to the run store (read-only, with a notice, if locked)."""
    try:
        store, notice = _open_store(db_path())
    except RunStoreError as exc:
        st.error(str(exc))
        st.stop()
    if notice:
        st.warning(f"Read-only snapshot: {notice} This page shows a copy taken when the app opened it; "
                   "replays and edits are disabled until the other process finishes.")
        if st.button("Refresh the snapshot", key="omem_refresh"):
            _open_store.clear()
            st.rerun()
    return store


def text_block(text: str, *, height: int | None = None) -> None:
    """Show dataset or model text exactly as text (no Markdown, no HTML)."""
    st.code(text or "(empty)", language="text", wrap_lines=True, height=height)


@st.cache_data(show_spinner=False)
def _load(path: str, fmt: str | None) -> list[Conversation]:
    return load_dataset(path, fmt)


def dataset_picker(prefix: str) -> Conversation | None:
    """Sidebar: dataset (project, shared, or upload) and conversation."""
    entries = known_datasets()
    names = [f"{e.name} ({e.origin})" for e in entries] + [UPLOAD]
    default = next((i for i, e in enumerate(entries) if e.path == DEMO_DATASET), 0)
    choice = st.sidebar.selectbox("Dataset", names, index=default, key=f"{prefix}_dataset")
    try:
        if choice == UPLOAD:
            upload = st.sidebar.file_uploader("Conversation file (JSON or JSON Lines)", key=f"{prefix}_upload")
            if upload is None:
                st.info("Upload a dataset file: the project's JSON Lines format, LoCoMo, OpenAI or ShareGPT.")
                return None
            folder = Path(tempfile.gettempdir()) / "omem-uploads"
            folder.mkdir(exist_ok=True)
            path = folder / Path(upload.name).name
            path.write_bytes(upload.getvalue())
            conversations = _load(str(path), None)
        else:
            entry = entries[names.index(choice)]
            conversations = _load(str(entry.path), entry.format)
    except DatasetError as exc:
        st.error(f"Cannot read the dataset: {exc}")
        return None
    ids = [c.id for c in conversations]
    picked = st.sidebar.selectbox("Conversation", ids, key=f"{prefix}_conversation") if len(ids) > 1 else ids[0]
    conversation = conversations[ids.index(picked)]
    st.sidebar.caption(f"{len(conversation.turns)} messages · {len(conversation.probes)} probes")
    return conversation


def prompt_choices(store: RunStore, name: str) -> dict[str, Prompt]:
    choices = {prompt.version: prompt for prompt in BUILTIN_PROMPTS[name]}  # the default first
    saved = store.prompts()
    for _, row in saved[saved.name == name].iterrows():
        choices.setdefault(row.version, Prompt(name=name, version=row.version, text=row.text))
    return choices


def config_form(store: RunStore, prefix: str, conversation: Conversation | None, *, container=None) -> ReplayConfig:
    """Observer, reflector, thresholds, window, token counter and prompt versions."""
    box = container or st.sidebar
    models = usable_models()
    box.caption("Usable here: " + ", ".join(models) + " (others need their provider's API key in the "
                "environment)")
    is_demo = conversation is not None and conversation.source == str(DEMO_DATASET)
    obs_default, ref_default = DEMO_THRESHOLDS if is_demo else (1000, 2000)
    observer = box.selectbox("Observer model", models, key=f"{prefix}_observer", accept_new_options=True,
                             help="Any litellm model string; models with keys in the environment are listed.")
    reflector = box.selectbox("Reflector model", [*models, "none"], key=f"{prefix}_reflector",
                              accept_new_options=True)
    for model in {observer, reflector} - {"none"}:
        status = model_status(model)
        if not status.usable:
            box.warning(f"{model}: {status.reason}")
    observation = box.number_input("Observation threshold (tokens)", 10, 100_000, obs_default, step=50,
                                   key=f"{prefix}_obs_{obs_default}")
    reflection = box.number_input("Reflection threshold (tokens)", 10, 200_000, ref_default, step=50,
                                  key=f"{prefix}_ref_{ref_default}")
    window = box.number_input("Window (last messages)", 1, 200, 10, key=f"{prefix}_window")
    counter = box.selectbox("Token counter", TOKEN_COUNTERS, key=f"{prefix}_counter")
    observer_prompts = prompt_choices(store, "observer")
    reflector_prompts = prompt_choices(store, "reflector")
    observer_prompt = box.selectbox("Observer prompt", list(observer_prompts), key=f"{prefix}_oprompt")
    reflector_prompt = box.selectbox("Reflector prompt", list(reflector_prompts), key=f"{prefix}_rprompt")
    return ReplayConfig(
        observer=observer, reflector=None if reflector == "none" else reflector,
        observation_threshold=int(observation), reflection_threshold=int(reflection), last_messages=int(window),
        token_counter=counter, observer_prompt=observer_prompts[observer_prompt],
        reflector_prompt=reflector_prompts[reflector_prompt],
    )


def run_replay(store: RunStore, conversation: Conversation, config: ReplayConfig, *,
               label: str | None = None) -> ReplayResult | None:
    """Run a replay with a progress bar; a provider error is shown, the recorded steps kept."""
    if store.read_only:
        st.error("The run store is read-only in this process; a replay cannot be recorded.")
        return None
    bar = st.progress(0.0, text=f"Replaying {conversation.id}…")

    def progress(done: int, total: int, message: str) -> None:
        if done == total or done % 5 == 0:
            bar.progress(done / max(total, 1), text=f"Replaying {conversation.id}: {message}")

    try:
        result = asyncio.run(replay(conversation, config, store, progress=progress, label=label))
    except ReplayFailed as exc:
        bar.empty()
        st.error(f"The model call failed: {exc}. The run {exc.result.run_id} kept its "
                 f"{exc.result.steps} recorded steps and can be resumed from the CLI.")
        return exc.result
    except ValueError as exc:
        bar.empty()
        st.error(str(exc))
        return None
    bar.empty()
    return result


def run_label(row: pd.Series) -> str:
    figures = []
    if pd.notna(row.get("compression")):
        figures.append(f"{row['compression']:.1f}x")
    if pd.notna(row.get("retention")):
        figures.append(f"retention {row['retention']:.2f}")
    return f"{row['run_id']} · {row['conversation_id']} · {row['status']}" + (
        f" · {' · '.join(figures)}" if figures else "")


def run_picker(store: RunStore, label: str, key: str, *, default: str | None = None,
               container=None) -> str | None:
    runs = store.runs()
    if runs.empty:
        return None
    box = container or st
    ids = list(runs.run_id)
    labels = {r.run_id: run_label(r) for _, r in runs.iterrows()}
    index = ids.index(default) if default in ids else 0
    return box.selectbox(label, ids, index=index, format_func=labels.get, key=key)


def open_run(run_id: str) -> None:
    st.session_state[RUN_KEY] = run_id
