"""Streamlit helpers shared by the app's pages: the store, run pickers, the config form.

Display only: data comes from :mod:`workbench.runstore` and :mod:`workbench.analysis`. Dataset and
model text is always shown as text (``st.code``/``st.text``/dataframes), never as HTML.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import os
import re
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import streamlit as st

from omem_core import Prompt
from omem_core.prompts import BUILTIN_PROMPTS

from .catalog import DEMO_DATASET, known_datasets
from .datasets import (
    FORMATS,
    REGISTRY,
    Conversation,
    ConversationInfo,
    DatasetError,
    list_conversations,
    load_conversation,
)
from .models import model_status, usable_models
from .replay import TOKEN_COUNTERS, ReplayConfig, ReplayFailed, ReplayResult, replay
from .errors import WorkbenchError
from .formatting import MISSING, count, missing, ratio, share
from .runstore import RunStore, RunStoreError, RunStoreLocked

RUN_KEY = "omem_run"  # the run opened across pages
UPLOAD = "Upload a file…"
BY_PATH = "Open a file or folder by path…"
AUTO = "detect automatically"
DEMO_THRESHOLDS = (300, 600)  # the demo chat is ~3.6k tokens: scaled so every stage shows
# A whole-number field's format: the field holds a real number (see config_form) shown as typed,
# 1000 not 1000.00 (sprintf.js prints a %g number in full: 1234567, not 1.23457e+06).
WHOLE = "%g"
APP_WAIT_S = 10.0  # how long a page waits for the run store while a CLI command writes it ($OMEM_DB_WAIT)


def db_path() -> str:
    return os.environ.get("OMEM_DB") or "runs.duckdb"


SNAPSHOT_KEY = "omem_snapshot"  # this session's read-only copy of a run store another program holds


@st.cache_resource(show_spinner=False)
def _open_store(path: str) -> RunStore:
    """The app's run store. It holds no connection between operations (the CLI can write the same
    file meanwhile): ``RunStoreLocked`` when another program keeps the file open (see get_store)."""
    wait = float(os.environ["OMEM_DB_WAIT"]) if os.environ.get("OMEM_DB_WAIT") else APP_WAIT_S
    return RunStore(path, wait_s=wait)


def _snapshot(path: str) -> RunStore:
    try:
        return RunStore.snapshot(path)
    except (OSError, RunStoreError) as exc:
        raise RunStoreError(f"{path} is held by another program and no snapshot could be taken: {exc}") from exc


def get_store() -> RunStore:
    """The run store; while another program keeps the file open, a read-only snapshot of it with
    a notice. The snapshot is the session's own (its "Try the file again" closes it, which removed
    the copy another tab was reading), and goes with the session."""
    path = db_path()
    store = st.session_state.get(SNAPSHOT_KEY)
    if store is not None and store.snapshot_of != str(Path(path)):  # (another run store chosen since)
        store.close()
        store = st.session_state[SNAPSHOT_KEY] = None
    try:
        if store is None:
            try:
                store = _open_store(path)
            except RunStoreLocked:
                store = st.session_state[SNAPSHOT_KEY] = _snapshot(path)
    except RunStoreError as exc:
        error("The run store cannot be opened: ", exc)
        st.stop()
    if store.snapshot_of is not None:
        cut = (" What the page was doing when it found the file held (a save, a delete) was not done: do it "
               "again once the file is free." if st.session_state.pop("omem_held_cut", False) else "")
        st.warning(plain(f"Read-only: another program keeps {Path(path).name} open, so this page shows a copy "
                         "taken when the app found it so, and replays and edits are off until that program "
                         f"closes it.{cut}"))
        if st.button("Try the file again", key="omem_refresh"):
            store.close()  # (removes the copy: each try that finds the file still held takes a new one)
            st.session_state[SNAPSHOT_KEY] = None
            st.rerun()
    return store


def guarded(body: Callable[[], None]) -> Callable[[], None]:
    """A fragment's ``body`` that reads the run store, turning a ``RunStoreLocked`` into the
    session's read-only snapshot as a whole run of a page does (``app.py``): a fragment rerun does
    not go through it, and showed the traceback."""
    @functools.wraps(body)
    def run() -> None:
        try:
            body()
        except RunStoreLocked as exc:
            held_elsewhere(exc)
    return run


def held_elsewhere(exc: RunStoreLocked) -> None:
    """A page's operation found the run store held by another program past the wait (a notebook
    keeping a connection, even a read-only one, opened after the app): the session goes on with a
    read-only snapshot, as when the app opens on a held file. Every page showed a traceback."""
    if st.session_state.get(SNAPSHOT_KEY) is not None:
        raise exc  # (a snapshot is never held: not ours)
    try:
        st.session_state[SNAPSHOT_KEY] = _snapshot(db_path())
        st.session_state["omem_held_cut"] = True  # (said once, with the notice)
    except RunStoreError as error_:
        error("The run store cannot be opened: ", error_)
        st.stop()
    st.rerun()


_MARKDOWN_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")


# Where Streamlit's Markdown (GFM) would turn plain text into a link whatever its escapes, since
# it finds URLs and e-mail addresses in the text *after* escapes are read: "http://…", "www.…",
# "name@host". Those are shown as code (GFM links nothing in a code span, and what is copied from
# it is the address as written); an invisible WORD JOINER breaks any other such match.
# Each alternative starts only where its first character cannot continue a longer run (the
# lookbehinds), so a long run of letters is scanned once, not from every position (40,000 letters
# took 6 s); a backtick never belongs to an address (it would end up inside the code span).
_ADDRESS = re.compile(r"(?:(?<![a-z0-9+.-])[a-z][a-z0-9+.-]*://|(?<![\w.])www\.)[^\s<>`]*[^\s<>`.,;:!?'\")\]}]"
                      r"|(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.IGNORECASE)
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=\bwww)(?=\.)|(?<=@)", re.IGNORECASE)
WORD_JOINER = "\u2060"


def _escaped(text: str) -> str:
    return _MARKDOWN_SPECIAL.sub(r"\\\1", _AUTOLINK.sub(WORD_JOINER, text))


def _code(text: str) -> str:
    """``text`` (an address: never a backtick in it) as a Markdown code span."""
    return f"`{text}`"


def plain(text: object) -> str:
    """``text`` escaped so Streamlit's Markdown shows it literally: no links, images, emphasis or
    HTML from dataset values or error messages. Every ASCII punctuation mark is backslash-escaped;
    web addresses and e-mail addresses, which GFM would link however escaped, are shown as code
    (copied as written), and any other ``://``, ``www.`` or ``@`` gets an invisible word joiner."""
    text, parts, start = str(text), [], 0
    for match in _ADDRESS.finditer(text):
        end = match.end()
        while text[end:end + 1] == ")" and text.count("(", match.start(), end) > text.count(")", match.start(), end):
            end += 1  # a closing parenthesis that balances one inside the address is part of it (GFM's rule)
        parts += [_escaped(text[start:match.start()]), _code(text[match.start():end])]
        start = end
    return "".join(parts) + _escaped(text[start:])


def rule_warning(experiment: dict[str, Any], runs: pd.DataFrame) -> bool:
    """A warning when an experiment's figures are not all under the current retention rule
    (:func:`workbench.experiments.rule_note`); whether ``rescore`` would bring them there."""
    from .app_data import as_sentence
    from .experiments import rule_note

    note, rescorable = rule_note(experiment, runs)
    if note:
        st.warning(plain(as_sentence(note)))
    return rescorable


def error(prefix: str, detail: object = "") -> None:
    """An error banner: our ``prefix`` (Markdown) and the data in ``detail`` shown as text."""
    st.error(prefix + plain(detail))


def figures(data: Any, *, key: str, **kwargs) -> Any:
    """``st.dataframe`` of a table already formatted as text (``app_data`` tables), its figure
    columns right-aligned as numbers are. ``data`` may be a pandas Styler."""
    from .app_data import figure_columns, text_widths

    frame = data.data if hasattr(data, "data") else data
    aligned = set(figure_columns(frame))
    widths = text_widths(frame)
    config = {name: st.column_config.Column(alignment="right" if name in aligned else None, width=widths.get(name))
              for name in aligned | set(widths)}
    for name, given in kwargs.pop("column_config", {}).items():  # the caller's settings win where set
        config[name] = ({**config.get(name, {}), **{k: v for k, v in given.items() if v is not None}}
                        if isinstance(given, dict) else given)  # (a label, or None to hide it)
    return st.dataframe(data, key=key, column_config=config, **kwargs)


def table(frame: pd.DataFrame, *, key: str, scores: bool = False, **kwargs) -> Any:
    """``st.dataframe`` with readable headers and number formats (:func:`app_data.column_spec`),
    numbers kept numeric (so columns sort by value) and missing values shown as a dash, never None.

    Streamlit draws a missing number as "None" whatever the format, so a number column with a gap
    is shown as text, formatted alike and right-aligned (it then sorts as text)."""
    from .app_data import column_spec, drawn_as_text, number_text

    spec = column_spec(frame, scores=scores)
    config, shown = {}, frame.copy()
    for name, (label, number) in spec.items():
        column = frame[name]
        if number is not None and drawn_as_text(column):
            shown[name] = column.map(lambda v, f=number: number_text(v, f))
            config[name] = st.column_config.Column(label, alignment="right")
        elif number is not None:
            config[name] = st.column_config.NumberColumn(label, format=number)
        elif pd.api.types.is_datetime64_any_dtype(column):
            config[name] = st.column_config.DatetimeColumn(label, format="YYYY-MM-DD HH:mm")
        else:
            config[name] = st.column_config.Column(label)
            if not pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
                # text (pandas 3 gives it its own "str" dtype, not object): a dash where it is missing
                shown[name] = column.map(lambda v: MISSING if missing(v) else v)
    return st.dataframe(shown, key=key, column_config=config | kwargs.pop("column_config", {}), **kwargs)


class MetricRow:
    """Metrics side by side that wrap onto the next line when the page is narrow (``st.columns``
    cuts each figure to "6…" at 900 px): ``row = ui.MetricRow(); row.metric(...)``."""

    def __init__(self) -> None:
        self.box = st.container(horizontal=True, gap="medium")

    def metric(self, *args: Any, **kwargs: Any) -> Any:
        return self.box.metric(*args, width="content", **kwargs)


def warning(prefix: str, detail: object = "") -> None:
    """A warning banner: our ``prefix`` (Markdown) and the data in ``detail`` shown as text."""
    st.warning(prefix + plain(detail))


def diff_block(diff: str, *, empty: str) -> None:
    """A unified diff as text, its removed and added lines coloured (``empty`` when there is none)."""
    st.code(diff or empty, language="diff" if diff else "text", wrap_lines=True)


def text_block(text: str, *, height: int | None = None) -> None:
    """Show dataset or model text exactly as text (no Markdown, no HTML)."""
    st.code(text or "(empty)", language="text", wrap_lines=True, height=height)


@st.cache_data(show_spinner=False, max_entries=64)
def _listing(path: str, fmt: str | None, stamp: tuple[int, int]) -> list[ConversationInfo]:
    """The conversations of a dataset (ids and sizes), without holding them all: a large file is
    indexed once. ``stamp`` (size, mtime) makes an edited file be read again."""
    return list_conversations(path, fmt)


@st.cache_data(show_spinner=False, max_entries=16)
def _conversation(path: str, fmt: str | None, stamp: tuple[int, int], conversation_id: str) -> Conversation:
    return load_conversation(path, conversation_id, fmt)


def _stamp(path: Path) -> tuple[int, int]:
    try:
        info = path.stat()
    except OSError:
        return (0, 0)
    return (info.st_size, info.st_mtime_ns)


def _uploads() -> Path:
    """The folder of this user's uploads, in the temporary folder and readable by this user only:
    uploads are conversations, often private, and a shared ``omem-uploads`` let every user of the
    machine read them (a folder of that name made by another user is refused, never used)."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    root = Path(tempfile.gettempdir()) / f"omem-uploads-{user}"
    root.mkdir(mode=0o700, exist_ok=True)
    if hasattr(os, "getuid"):
        if root.is_symlink() or root.stat().st_uid != os.getuid():
            raise ValueError(f"{root} belongs to another user (or is a link): remove it, or set TMPDIR to a "
                             "folder of yours")
        if root.stat().st_mode & 0o077:
            root.chmod(0o700)
    return root


def _saved_upload(upload) -> Path:
    """The uploaded bytes in a folder named by their sha256 (per content, never per file name, so a
    second upload called like the first never shows the first file's data); a zip (a folder
    format such as BEAM) is unpacked there, whole or not at all: ``ValueError`` saying what is
    wrong with an archive that cannot be (a half-unpacked folder, kept under the same hash, read
    as another error at the next upload of the file)."""
    data = upload.getvalue()
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = _uploads() / digest
    folder.mkdir(parents=True, exist_ok=True)
    name = Path(upload.name).name or "upload"
    target = folder / name
    if not target.exists():
        _written(target, lambda part: part.write_bytes(data))
    if name.lower().endswith(".zip"):
        unpacked = folder / "unzipped"
        if not unpacked.exists():
            _written(unpacked, lambda part: _unzip(data, name, part))
        entries = [p for p in unpacked.iterdir() if not p.name.startswith(("__MACOSX", "."))]
        if not entries:
            raise ValueError(f"{name} holds no files: zip the dataset's folder (or file) and upload that")
        return entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
    return target


def _written(target: Path, write) -> None:  # type: ignore[no-untyped-def]
    """``write(part)`` to a temporary name beside ``target``, then renamed to it: a failed write
    never leaves a partial ``target``, and two sessions uploading the same file never mix theirs."""
    import shutil
    import uuid

    part = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    try:
        write(part)
        try:
            os.replace(part, target)
        except OSError:
            if not target.exists():
                raise  # (else another session's copy of the same bytes got there first)
    finally:
        if part.is_dir():
            shutil.rmtree(part, ignore_errors=True)
        elif part.exists():
            part.unlink()


UNZIPPED_LIMIT = 8 << 30  # bytes an uploaded archive may unpack to (its members' sizes, as it declares them)


def _unzip(data: bytes, name: str, into: Path) -> None:
    import zlib

    into.mkdir(parents=True)  # (an empty archive makes no folder of its own)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if (size := sum(member.file_size for member in archive.infolist())) > UNZIPPED_LIMIT:
                raise ValueError(f"{name} would unpack to {size / 2**30:,.1f} GiB, more than the "
                                 f"{UNZIPPED_LIMIT / 2**30:,.0f} GiB an upload may: give the dataset's path instead")
            archive.extractall(into)  # zipfile drops absolute paths and ".." components
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, zlib.error, RuntimeError) as exc:
        # (RuntimeError: a member encrypted, "password required"; zlib.error: a damaged deflated one)
        reason = ("it is not a zip archive" if "not a zip file" in str(exc).lower() else
                  "a file in it is encrypted" if "encrypted" in str(exc).lower() else f"it is damaged ({exc})")
        raise ValueError(f"{name} cannot be unpacked: {reason}; upload the dataset's folder zipped again (without a "
                         "password), or the file itself") from None


def _format_picker(prefix: str) -> str | None:
    described = {f.name: f.description for f in REGISTRY}
    choice = st.sidebar.selectbox("Format", [AUTO, *FORMATS], key=f"{prefix}_format",
                                  help="The dataset's format; detected from its content unless chosen here. "
                                       + " ".join(f"**{n}**: {d}" for n, d in described.items()))
    return None if choice == AUTO else choice


def unreadable(prefix: str, detail: object) -> NoReturn:
    """The error banner of a dataset that cannot be read, and the end of the page: what the page
    would show below it (the last run, the last comparison) is about another dataset and would
    read as this one's result."""
    error(prefix, detail)
    st.stop()
    raise AssertionError("st.stop() returned")  # (it raises; for type checkers)


def kept(key: str, options: Sequence[Any] | None = None) -> bool:
    """Keep a widget's value across pages. Streamlit forgets a widget's state on a page that does
    not draw it, so coming back to a page reset its dataset picker to the demo — which then
    counted as a new choice, and a run opened from another page gave way to the demo's newest.
    Call before drawing the widget: its last value is put back (when still one of ``options``),
    and ``True`` says so (then give the widget no default of its own)."""
    shadow = f"_kept_{key}"
    if key in st.session_state:
        value = st.session_state[key]
        st.session_state[shadow] = value
        if options is None or value in options:
            # Set again, so the browser is sent it: a widget the last run did not draw (a page ended
            # early by a dataset that cannot be read) kept its value here, but the browser drew it
            # anew at its default (the explorer's slider at 0 beside "At step 4").
            st.session_state[key] = value
        return True
    if shadow in st.session_state and (options is None or st.session_state[shadow] in options):
        st.session_state[key] = st.session_state[shadow]
        return True
    return False


def dataset_picker(prefix: str) -> Conversation | None:
    """Sidebar: dataset (project, shared, an upload, or any path) and conversation. A dataset
    that cannot be read shows its error and ends the page (:func:`unreadable`); its warnings
    (evidence pointing nowhere, messages out of time order) are shown in the sidebar.

    An upload is kept for this browser session only and keyed by its content."""
    entries = known_datasets()
    names = [f"{e.name} ({e.origin})" for e in entries] + [UPLOAD, BY_PATH]
    default = next((i for i, e in enumerate(entries) if e.path == DEMO_DATASET), 0)
    choice = st.sidebar.selectbox("Dataset", names, key=f"{prefix}_dataset",
                                  **({} if kept(f"{prefix}_dataset", names) else {"index": default}))
    if choice == UPLOAD:
        upload = st.sidebar.file_uploader("Conversation file (JSON, JSON Lines, or a zip of a folder)",
                                          key=f"{prefix}_upload")
        fmt = _format_picker(prefix)
        if upload is None:
            st.info("Upload a dataset: " + ", ".join(f.name for f in REGISTRY if not f.folder)
                    + " as a file; " + ", ".join(f.name for f in REGISTRY if f.folder) + " as a zip of its folder.")
            return None
        try:
            path = _saved_upload(upload)
        except (ValueError, OSError) as exc:
            unreadable("Cannot read the upload: ", exc)
    elif choice == BY_PATH:
        kept(f"{prefix}_path")
        typed = st.sidebar.text_input("Path", key=f"{prefix}_path", placeholder="/data/locomo10.json")
        fmt = _format_picker(prefix)
        if not typed.strip():
            st.info("Type the path of a dataset file or folder in the sidebar.")
            return None
        path = Path(typed.strip()).expanduser()
        if not path.exists():
            unreadable("No such file or folder: ", path)
    else:
        entry = entries[names.index(choice)]
        path, fmt = entry.path, entry.format
    stamp = _stamp(path)
    # An upload's error names the file the user chose, not where the server keeps its copy.
    shown = (lambda exc: str(exc).replace(str(path), upload.name)) if choice == UPLOAD else str
    try:
        listed = _listing(str(path), fmt, stamp)
    except DatasetError as exc:
        unreadable("Cannot read the dataset: ", shown(exc))
    ids = [c.id for c in listed]
    if len(ids) > 1:
        kept(f"{prefix}_conversation", ids)
        picked = st.sidebar.selectbox("Conversation", ids, key=f"{prefix}_conversation")
    else:
        picked = ids[0]
    try:
        conversation = _conversation(str(path), fmt, stamp, picked)
    except DatasetError as exc:
        unreadable("Cannot read the conversation: ", shown(exc))
    st.sidebar.caption(plain(f"{count(len(conversation.turns), 'message')} · {count(len(conversation.probes), 'probe')}"))
    for warning in conversation.warnings:
        st.sidebar.warning(plain(warning))
    if not conversation.probes:
        st.sidebar.info("This conversation has no probes: replays show compression and the timeline, "
                        "but no retention.")
    elif all(p.gold is None for p in conversation.probes):  # (MemoryBank's: said before a replay, not after)
        held = ("Its probe has no gold answer" if len(conversation.probes) == 1
                else f"None of its {len(conversation.probes)} probes has a gold answer")
        st.sidebar.warning(
            f"{held}, so retention cannot be scored: replays show compression and the timeline"
            + (" (an LLM judge grades questions about something never said: the CLI's replay --judge)."
               if any(p.abstention for p in conversation.probes) else "."))
    return conversation


def prompt_choices(store: RunStore, name: str) -> dict[str, Prompt]:
    choices = {prompt.version: prompt for prompt in BUILTIN_PROMPTS[name]}  # the default first
    saved = store.prompts()
    for _, row in saved[saved.name == name].iterrows():
        choices.setdefault(row.version, Prompt(name=name, version=row.version, text=row.text))
    return choices


def config_form(store: RunStore, prefix: str, conversation: Conversation | None, *,
                container=None) -> ReplayConfig | None:
    """Observer, reflector, thresholds, window, token counter and prompt versions; ``None`` (with
    the reason shown) when a number is not one a replay takes, or a model cannot be called here
    (unknown, its key missing): the caller's Run stays disabled."""
    from .app_data import as_sentence, config_problems

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
    unusable = [status for status in map(model_status, sorted({observer, reflector} - {"none"})) if not status.usable]
    for status in unusable:  # (Run stays off: the replay would only be refused, and recorded as failed)
        box.warning(plain(f"{status.model}: {status.reason}. A replay needs a model usable here."))
    # (no bounds on the fields: a value typed outside them was dropped, the run made with the last one;
    # and real numbers shown as whole ones: the browser reads a whole-number field's "2.5" as 2 and
    # "1e3" as 1, without a word, where config_problems says 2.5 is not a whole number)
    observation = box.number_input("Observation threshold (tokens)", value=float(obs_default), step=50.0,
                                   format=WHOLE, key=f"{prefix}_obs_{obs_default}")
    reflection = box.number_input("Reflection threshold (tokens)", value=float(ref_default), step=50.0,
                                  format=WHOLE, key=f"{prefix}_ref_{ref_default}")
    window = box.number_input("Window (last messages)", value=10.0, step=1.0, format=WHOLE, key=f"{prefix}_window")
    backlog = box.number_input("Backlog ceiling (tokens, 0 = off)", value=0.0, step=500.0, format=WHOLE,
                               key=f"{prefix}_backlog",
                               help="Opt-in: past this many tokens waiting to be observed, the observer takes "
                                    "larger segments until the backlog is under it again.")
    problems = config_problems(observation, reflection, window, backlog)
    counter = box.selectbox("Token counter", TOKEN_COUNTERS, key=f"{prefix}_counter")
    observer_prompts = prompt_choices(store, "observer")
    reflector_prompts = prompt_choices(store, "reflector")
    observer_prompt = box.selectbox("Observer prompt", list(observer_prompts), key=f"{prefix}_oprompt")
    reflector_prompt = box.selectbox("Reflector prompt", list(reflector_prompts), key=f"{prefix}_rprompt")
    if problems:
        box.error(plain(as_sentence("; ".join(problems))))
        return None
    if unusable:
        return None
    return ReplayConfig(
        observer=observer, reflector=None if reflector == "none" else reflector,
        observation_threshold=int(observation), reflection_threshold=int(reflection), last_messages=int(window),
        token_counter=counter, observer_prompt=observer_prompts[observer_prompt],
        reflector_prompt=reflector_prompts[reflector_prompt], max_backlog=int(backlog) or None,
    )


def run_replay(store: RunStore, conversation: Conversation, config: ReplayConfig, *,
               label: str | None = None, resume: str | None = None) -> ReplayResult | None:
    """Run a replay (or ``resume`` a stored one) with a progress bar. A rejected configuration or
    a failed model call is shown as an error (never as a result); a failed run keeps its recorded
    steps."""
    if store.read_only:
        st.error("The run store is a read-only snapshot here; a replay cannot be recorded.")
        return None
    from .app_data import replay_progress_text

    bar = st.progress(0.0, text=plain(f"Replaying {conversation.id}…"))

    def progress(done: int, total: int, message: str) -> None:
        if done == total or done % 5 == 0:
            bar.progress(done / max(total, 1), text=plain(replay_progress_text(conversation.id, done, total, message)))

    try:
        result = asyncio.run(replay(conversation, config, store, progress=progress, label=label, resume=resume))
    except ReplayFailed as exc:
        from .app_data import terminal_command

        bar.empty()
        partial = exc.result
        if exc.resumable:
            error(f"The replay failed at step {partial.steps} of {partial.planned_steps}; run {partial.run_id} keeps "
                  "its recorded steps (resume it with "
                  f"{terminal_command(f'replay --resume {partial.run_id}', store.path)}). ", exc)
        else:  # the dataset's own message: a resume would stop there again
            error(f"The replay stopped at step {partial.steps} of {partial.planned_steps} on a message of the "
                  f"dataset; run {partial.run_id} keeps its recorded steps. Correct or re-date that message in the "
                  "dataset, then replay again. ", exc)
        return exc.result
    except WorkbenchError as exc:
        bar.empty()
        error("", exc)
        return None
    bar.empty()
    return result


def run_label(row: pd.Series) -> str:
    """What tells runs apart first (a sidebar cuts the end off): conversation, configuration in
    short, figures, the state of a run that did not finish, then the id."""
    from .app_data import short_config, status_text

    done = row.get("status") == "completed"
    parts = [str(row["conversation_id"]), short_config(row)]
    if not missing(row.get("compression")):
        parts.append(ratio(row["compression"], partial=not done))
    if not missing(row.get("retention")):
        parts.append(f"retention {share(row['retention'])}")
    if not done:
        parts.append(status_text(row.get("status"), row.get("steps"), row.get("planned_steps")))
    return " · ".join([*parts, str(row["run_id"])])


DELETED_HERE_KEY = "omem_deleted_here"  # runs this session deleted: no "deleted elsewhere" for them


def forget_run(run_id: str) -> None:
    """A run this session deleted: let go of it wherever a page kept it (the run opened across
    pages, Traces' call), and never call it "deleted elsewhere" (Traces did, after a delete on
    the Runs page)."""
    st.session_state.setdefault(DELETED_HERE_KEY, set()).add(run_id)
    if st.session_state.get(RUN_KEY) == run_id:
        st.session_state.pop(RUN_KEY)
    if (st.session_state.get(TRACE_KEY) or (None,))[0] == run_id:
        st.session_state.pop(TRACE_KEY)


def warn_link_run_gone(store: RunStore, run_id: str) -> None:
    """A link named a run the store does not hold: said, unless this session deleted it (then the
    page simply opens without it)."""
    if run_id not in st.session_state.get(DELETED_HERE_KEY, set()):
        st.warning(plain(f"Run {run_id} of the link is not in this run store ({store.path})."))


def run_picker(store: RunStore, label: str, key: str, *, default: str | None = None,
               container=None, only: set[str] | None = None, keep: bool = False) -> str | None:
    """A stored run, chosen in a select box labelled by :func:`run_label` (``None`` when there is
    none); ``only``: the run ids it offers (a filtered list's), else every run; ``keep``: the run
    picked last time this page was drawn comes back with it (see :func:`kept`), before ``default``."""
    runs = store.runs()
    box = container or st
    # The run this page showed (or was asked to open) is gone: deleted elsewhere. Said, never a
    # silent switch to another run. (A kept run is the one this page showed: it comes first.)
    if keep:
        kept(key)
    wanted = (st.session_state.get(key) if keep else None) or default or st.session_state.get(key)
    # (the picker's own value too: the run picked there over ``default`` was dropped without a word)
    fell_back = False
    for gone in dict.fromkeys(r for r in (wanted, st.session_state.get(key)) if r and r not in set(runs.run_id)):
        fell_back = True
        if gone not in st.session_state.get(DELETED_HERE_KEY, set()):  # (deleted on the Runs page: known)
            st.warning(plain(f"Run {gone} is no longer in the run store (deleted elsewhere)."))
        if st.session_state.get(RUN_KEY) == gone:
            st.session_state.pop(RUN_KEY)
        if st.session_state.get(key) == gone:
            st.session_state.pop(key)
            st.session_state.pop(f"_kept_{key}", None)
        default = None if default == gone else default
    if only is not None:
        runs = runs[runs.run_id.isin(only)]
    if runs.empty:
        return None
    ids = list(runs.run_id)
    labels = {r.run_id: run_label(r) for _, r in runs.iterrows()}
    # ``default`` (the run opened across pages), else the newest run that completed: a page never
    # opens on a failed run's "no steps" unless that run was asked for.
    done = [i for i, status in enumerate(runs.status) if status == "completed"]
    index = ids.index(default) if default in ids else (done[0] if done else 0)
    if fell_back and st.session_state.get(key) not in ids:
        # Set through the widget's state, so the browser is told: it kept showing the deleted run
        # while the page (and its buttons: Delete run) acted on the run it fell back to.
        st.session_state[key] = ids[index]
    if keep and st.session_state.get(key) in ids:  # (drawn without a default of its own: its kept value stands)
        picked = box.selectbox(label, ids, format_func=labels.get, key=key)
    else:
        picked = box.selectbox(label, ids, index=index, format_func=labels.get, key=key)
    whole_label(box, labels.get(picked))
    return picked


def choice(box, label: str, options: Sequence[Any], *, key: str, format_func=None) -> Any:
    """A select box that is a new widget whenever its options change, keeping the choice made
    (under ``st.session_state[key]``) while the new options hold it. With one widget whose options
    changed (Compare's "only probes whose scores differ" toggle), the browser kept showing a probe
    the list no longer held while the server had picked another: "Open run" opened another probe
    than the one on screen."""
    import hashlib

    digest = hashlib.sha1("\x1f".join(map(str, options)).encode()).hexdigest()[:12]
    widget = f"{key}__{digest}"
    # Options changed since the last run (another widget now): it starts on the choice made, when
    # listed. (The same widget as the last run holds the user's latest pick: left alone.)
    # (Nor is a widget of a page left and come back to: Streamlit dropped its state, not ``key``.)
    if (st.session_state.get(f"{key}__widget") != widget or widget not in st.session_state) and \
            st.session_state.get(key) in options:
        st.session_state[widget] = st.session_state[key]
    st.session_state[f"{key}__widget"] = widget
    picked = box.selectbox(label, options, key=widget, **({"format_func": format_func} if format_func else {}))
    st.session_state[key] = picked
    return picked


SIDEBAR_FITS = 30  # characters of a label the sidebar's select box shows before it cuts the rest


def whole_label(box, text: str | None) -> None:
    """Under a picker in the sidebar, its choice written out in full when the select box would cut it."""
    if box is st.sidebar and text and len(text) > SIDEBAR_FITS:
        box.caption(plain(text))


def open_run(run_id: str) -> None:
    st.session_state[RUN_KEY] = run_id
    if (st.session_state.get(OPENED_FOR_KEY) or (None,))[0] != run_id:  # another run: no note about a probe
        st.session_state.pop(OPENED_FOR_KEY, None)


# -- experiments -----------------------------------------------------------------------------------

EXPERIMENT_KEY = "omem_experiment"  # the experiment opened across pages
_EXPERIMENT_LINK = "_omem_experiment_link"  # the address's experiment last followed (or written)
TRACE_KEY = "omem_trace"  # (run_id, call seq) opened in Traces


def experiment_picker(store: RunStore, label: str, key: str, *, container=None, disabled: bool = False,
                      frame: pd.DataFrame | None = None) -> str | None:
    """Pick an experiment (the one opened across pages by default); ``None`` when there is none.
    ``frame``: the experiments as the page shows them (one starting or resuming here), else the store's."""
    from .app_data import experiment_label

    frame = store.experiments() if frame is None else frame
    if frame.empty:
        return None
    box = container or st
    ids = list(frame.experiment_id)
    labels = {r["experiment_id"]: experiment_label(r) for r in frame.to_dict("records")}
    # A link names its experiment (?experiment=…): followed once, then a pick by hand wins (the
    # address follows the pick). Experiments, Tune and Compare kept no address: a link to the
    # experiment shown (for a demo, a colleague) opened whichever the other tab had last opened.
    linked = st.query_params.get("experiment")
    if isinstance(linked, str) and linked.strip() and linked != st.session_state.get(_EXPERIMENT_LINK):
        st.session_state[_EXPERIMENT_LINK] = linked
        if linked.strip() in ids:
            st.session_state[EXPERIMENT_KEY] = linked.strip()
        else:
            st.warning(plain(f"The link names experiment {linked.strip()}, which is not in this run store: the page "
                             "shows another."))
    # The experiment opened across pages is the one shown, set through the widget's state: a
    # browser keeps a widget's own selection (the previous experiment after a new one started)
    # unless the app sets it. A pick by hand opens that experiment (the callback runs first).
    wanted = st.session_state.get(EXPERIMENT_KEY)
    shown = st.session_state.get(key)
    for gone in dict.fromkeys(e for e in (wanted, shown) if e and e not in ids):  # deleted meanwhile: said
        if gone not in st.session_state.get(DELETED_HERE_KEY, set()):  # (it switched without a word)
            st.warning(plain(f"Experiment {gone} is no longer in the run store (deleted elsewhere)."))
    if wanted in ids:
        st.session_state[key] = wanted
    elif shown not in ids:  # none opened yet, or deleted meanwhile
        st.session_state[key] = ids[0]
    picked = box.selectbox(label, ids, format_func=labels.get, key=key, on_change=_open_experiment, args=(key,),
                           disabled=disabled)
    whole_label(box, labels.get(picked))
    st.session_state[EXPERIMENT_KEY] = picked
    if st.query_params.get("experiment") != picked:  # the address names what is shown: a link to it
        st.session_state[_EXPERIMENT_LINK] = picked
        st.query_params["experiment"] = picked  # (a page may name more: Compare's pair)
    return picked


def _open_experiment(key: str) -> None:
    st.session_state[EXPERIMENT_KEY] = st.session_state[key]


def running_notice(store: RunStore, experiment: dict, runs: pd.DataFrame) -> bool:
    """On a page of an experiment still running (here or in another process): say that its
    figures are partial, and rerun the page as runs finish. ``True`` when it is running."""
    from .app_data import completed_pairs

    if experiment.get("status") != "running":
        return False
    planned = len(experiment["conversations"]) * len(experiment["configs"])
    st.info(plain(f"This experiment is running ({completed_pairs(runs)} of {planned} runs so far): every figure "
                  "below is partial, and the page follows it as runs finish."))
    experiment_id, seen = experiment["experiment_id"], (len(runs), experiment.get("status"))

    @st.fragment(run_every=5)
    @guarded
    def follow() -> None:
        now = store.experiment_runs(experiment_id)
        if (len(now), store.experiment(experiment_id).get("status")) != seen:
            st.rerun()
    follow()
    return True


OPENED_FOR_KEY = "omem_opened_for"  # (run id, why it was opened): said at the top of the explorer


def open_run_at(run_id: str, step: int | None = None, why: str | None = None) -> None:
    """Open ``run_id`` in the explorer (at ``step`` when given); ``why`` (the probe a user came
    from Compare for) is said above it while that run is shown. The caller switches page."""
    st.session_state[RUN_KEY] = run_id
    st.session_state[OPENED_FOR_KEY] = (run_id, why)
    st.session_state["ex_mode"] = "Open a stored run"
    st.session_state.pop("ex_open", None)  # the explorer's picker then starts on this run
    if step is not None:
        st.session_state[f"ex_step_{run_id}"] = int(step)


def open_trace(run_id: str, seq: int) -> None:
    """Open one model call in Traces; the caller switches page."""
    st.session_state[TRACE_KEY] = (run_id, int(seq))
    # (this call, not the one at the explorer's step: that step counts as followed)
    st.session_state["_tr_step"] = (run_id, st.session_state.get(f"_kept_ex_step_{run_id}"))
    st.session_state.pop("tr_run", None)
    st.session_state.pop("tr_call", None)


@st.cache_data(show_spinner=False, max_entries=8)
def _experiment_tables(path: str, experiment_id: str, stamp: tuple) -> dict:
    """An experiment's figures and tables, computed once per change of the experiment (``stamp``:
    its update time and run counts), so pages rerun without recomputing bootstrap intervals."""
    from .experiments import summarise

    store = _open_store(path)
    with store.session():
        return {"experiment": store.experiment(experiment_id), "summaries": summarise(store, experiment_id),
                "runs": store.experiment_runs(experiment_id), "probes": store.experiment_probes(experiment_id),
                "losses": store.experiment_losses(experiment_id)}


@st.cache_data(show_spinner=False, max_entries=4)
def _judging_inputs(path: str, run_id: str, stamp: tuple) -> tuple[list, str]:
    from .experiments import judging_inputs as inputs

    return inputs(_open_store(path), run_id)


def judging_inputs(store: RunStore, run: dict) -> tuple[list, str]:
    """``experiments.judging_inputs`` of a completed run, kept per run and version of its dataset
    file: the Explorer reruns at each step of its slider, and read the conversation each time."""
    if store.snapshot_of or store.path == ":memory:":
        from .experiments import judging_inputs as inputs

        return inputs(store, run["run_id"])
    return _judging_inputs(db_path(), run["run_id"], _stamp(Path(run["dataset"])))


def experiment_tables(store: RunStore, experiment_id: str) -> dict:
    """``experiment``, ``summaries``, ``runs``, ``probes`` and ``losses`` of an experiment (cached
    until it changes: a run written or deleted, a resume, a status change)."""
    frame = store.experiments()
    row = frame[frame.experiment_id == experiment_id]
    if row.empty:
        from .runstore import UnknownRun

        raise UnknownRun(experiment_id, store.path, kind="experiment")
    r = row.iloc[0]
    stamp = (str(r.updated_at), int(r.runs), int(r.failed_runs), str(r.status))
    if store.snapshot_of or store.path == ":memory:":
        from .experiments import summarise

        return {"experiment": store.experiment(experiment_id), "summaries": summarise(store, experiment_id),
                "runs": store.experiment_runs(experiment_id), "probes": store.experiment_probes(experiment_id),
                "losses": store.experiment_losses(experiment_id)}
    return _experiment_tables(db_path(), experiment_id, stamp)
