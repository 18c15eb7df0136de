"""``python -m workbench``: replay, sweep, compare and export runs headless.

Every command writes to (or reads) the same DuckDB file as the app, ``runs.duckdb`` by default
(``--db`` or ``$OMEM_DB`` to move it). The file is opened for each operation, so the app and the
CLI take turns on it; a command that finds it busy waits (and says so).

``--help``, ``runs`` and ``datasets`` never import litellm or Streamlit (seconds each): the
modules that need them are imported inside the commands that use them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .catalog import DEMO_DATASET, ROOT, known_datasets
from .datasets import FORMATS  # the format registry (imports no model library)
from .datasets.base import ConversationNotFound
from .errors import ConfigurationError, WorkbenchError
from .formatting import (DEFAULT_DB, about_money, cli_command, count, money, not_text, printable, ratio, share,
                         short_path, split_list, terminal_text)
from .models import OFFLINE_MODEL

if TYPE_CHECKING:
    from omem_core import Prompt

    from .replay import ReplayResult
    from .runstore import RunStore

TOKEN_COUNTERS = ("heuristic", "o200k_base", "cl100k_base")

def _db(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value:  # (DuckDB took "" as a database in memory, with no tables; an empty $OMEM_DB is unset)
        raise click.BadParameter("empty: name the run store's file (runs.duckdb), or :memory:")
    return value


DB_OPTION = click.option("--db", default=lambda: os.environ.get("OMEM_DB") or DEFAULT_DB, show_default=DEFAULT_DB,
                         callback=_db, help="DuckDB run store (env OMEM_DB).")


def json_errors(command: Callable[..., None]) -> Callable[..., None]:
    """With ``--json``, an error still ends stdout with one JSON object, ``{"status": "failed",
    "error": …}`` (and the run's id when one was recorded), so a script reading the last line
    gets an answer whatever went wrong; the message goes to stderr as usual. (An option click
    refuses never reaches the command: ``JsonCommand`` reports those.)"""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        _answered.clear()
        try:
            command(*args, **kwargs)
        except click.ClickException as exc:
            if kwargs.get("as_json") and not _answered:
                click.echo(json.dumps({"status": "failed", "error": exc.format_message(),
                                       **getattr(exc, "json_fields", {})}))
            raise
        except click.Abort:  # a question left unanswered (end of input, Ctrl-C at the prompt)
            if kwargs.get("as_json") and not _answered:
                click.echo(json.dumps({"status": "failed", "error": "aborted at a question (--yes answers it)"}))
            raise
        except KeyboardInterrupt:
            # A Ctrl-C the command did not handle: while it started (loading the dataset, the model
            # library), or once it had given its answer (closing the store). It exits 130, as the
            # command's own handling does, not click's "Aborted!" with 1; an answer already out stands.
            if _answered:  # (and the exit code is the answer's, so a script reads them alike)
                _tell("\ninterrupted while closing: the command had finished (its answer above stands)")
                sys.exit(_answered[-1])
            else:
                _tell("\ninterrupted before the command finished")
                if kwargs.get("as_json"):
                    click.echo(json.dumps({"status": "interrupted", "error": "interrupted before the command finished"}))
            sys.exit(130)

    return wrapper


_answered: list[int] = []  # the exit code of the --json answer the running command printed (see _say_json)


def _say_json(answer: dict[str, Any], code: int = 0) -> None:
    """Print a command's ``--json`` answer: the one JSON object stdout ends with, and ``code`` the
    command exits with. An error or a Ctrl-C after it (while the command closes its store) adds no
    second answer, and a Ctrl-C then exits with ``code``: a "completed" answer exited 130."""
    click.echo(json.dumps(answer))
    _answered.append(code)


_ANY_TEXT = {"datasets"}  # commands none of whose arguments reach the run store (a file named in Latin-1 is listed)


class JsonCommand(click.Command):
    """A command whose option errors (``--observation-threshold 0``, a dataset path that does
    not exist) also end stdout with ``{"status": "failed", "error": …}`` under ``--json``; click
    still prints its usage message to stderr and exits 2."""

    def invoke(self, ctx: click.Context) -> Any:
        """The command, with a Ctrl-C it does not handle itself ending as every interrupt does:
        a word and exit status 130, not click's "Aborted!" and 1 (``json_errors`` commands say
        more, and keep an answer already given)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _tell("\ninterrupted")
            sys.exit(130)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = any(param.name == "as_json" for param in self.params) and self._asks_json(args)
        try:
            for arg in args if self.name not in _ANY_TEXT else ():
                if not_text(arg):  # (bytes that are not UTF-8 come as lone surrogates: DuckDB refused them)
                    raise click.UsageError(
                        f"'{printable(arg)}' is not UTF-8 text: the run store keeps names, labels and paths as "
                        "text (rename such a file, or give the text in UTF-8)", ctx)
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if wants_json:
                click.echo(json.dumps({"status": "failed", "error": exc.format_message()}))
            raise

    def _asks_json(self, args: list[str]) -> bool:
        """Whether ``--json`` is given as the flag (not as another option's value, nor after ``--``)."""
        takes_value = {opt for param in self.params if isinstance(param, click.Option) and not param.is_flag
                       for opt in param.opts}
        for i, arg in enumerate(args):
            if arg == "--":
                return False
            if arg == "--json" and not (i and args[i - 1] in takes_value):
                return True
        return False


class JsonGroup(click.Group):
    """A group whose commands (and sub-groups' commands) are ``JsonCommand``s."""

    command_class = JsonCommand
    group_class = type  # sub-groups are JsonGroups too


def _folder(value: str) -> Path:
    """An output folder; an empty one is refused (``Path("")`` is the current folder: ``--parquet ""``
    wrote its files there)."""
    if not value:
        raise click.BadParameter("empty: name a folder (. for this one)")
    return Path(value)


def _open_store(db: str) -> RunStore:
    from .runstore import RunStore

    try:
        return RunStore(db, on_wait=lambda message: _tell(message + "…"))
    except WorkbenchError as exc:
        raise click.ClickException(str(exc)) from exc


def _no_store(db: str) -> bool:
    """No run store at ``db`` yet: a command that only reads must not create one there."""
    return db != ":memory:" and not os.path.exists(db)


def _loading_note(stream: Any = None) -> bool:
    """Say on a terminal's stderr that the model library is loading (litellm's import takes 5-10
    s, and nothing else was printed meanwhile); nothing when it is loaded, or stderr is no terminal
    (scripts and logs stay as they were). Returns whether it said so."""
    stream = stream if stream is not None else sys.stderr
    if "litellm" in sys.modules or not getattr(stream, "isatty", lambda: False)():
        return False
    click.echo("loading the model library (litellm, a few seconds)…", file=stream)
    return True


@contextlib.contextmanager
def _using_store(db: str, *, existing: bool = False) -> Iterator[RunStore]:
    """The run store for one command; the workbench's errors become one-line CLI errors (a
    ``DatasetError`` names file, record and field), anything else is a bug and shows as one.
    ``existing``: the command only reads or changes what was recorded, so a path with no file
    (a typo in ``--db``) is an error instead of a new, empty store."""
    if existing and _no_store(db):
        raise click.ClickException(f"no run store at {db} (replay or experiment run creates one; --db or "
                                   "$OMEM_DB chooses the file)")
    store = _open_store(db)
    try:
        yield store
    except WorkbenchError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()


def _tell(text: str, *, nl: bool = True) -> None:
    """A line on stderr (progress, a warning, a note), best effort: a reader gone (``2>&1 | head -1``,
    a pager quit) failed the replay or experiment writing it with a BrokenPipeError, recorded as the
    run's error. After that, stderr goes nowhere and the work goes on (click's own exit deals with
    stdout)."""
    try:
        click.echo(text, nl=nl, err=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)


def _progress_printer(label: str, quiet: bool):
    """Progress on stderr; ``quiet`` (``--json``) keeps it off a log or a pipe, not off a terminal,
    where long work with no line for seconds looked hung."""
    state = {"last": -1}

    terminal = sys.stderr.isatty()
    quiet = quiet and not terminal

    def progress(done: int, total: int, _: str) -> None:
        if quiet:
            return
        percent = done * 100 // max(total, 1)
        step = 5 if terminal else 25  # a log gets a few whole lines, a terminal one updating line
        if percent != state["last"] and (percent % step == 0 or done == total):
            state["last"] = percent
            if terminal:
                _tell(f"\r{label} {percent:3d}% ({done}/{total} messages)", nl=done == total)
            else:
                _tell(f"{label} {percent:3d}% ({done}/{total} messages)")

    return progress


def _echo_wrapped(text: str, *, first: str = "", rest: str = "    ", err: bool = False) -> None:
    """``text`` wrapped at 100 columns (``first`` before its first line, ``rest`` before the others)."""
    # (a path or id is never split: it must stay whole to be copied; nor is an interval "[0.006, 0.031]")
    import re

    whole = re.sub(r"\[[^\[\]\s]+, [^\[\]\s]+\]", lambda m: m.group().replace(" ", "\u00a0"), text)
    wrapped = textwrap.fill(whole, 100, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                            break_on_hyphens=False).replace("\u00a0", " ")
    if err:
        _tell(wrapped)
    else:
        click.echo(wrapped)


def _dataset_name(path: str) -> str:
    """A known dataset by its name (as `datasets` lists it), another by its path."""
    names = {str(Path(e.path).resolve()): e.name for e in known_datasets()}
    return names.get(str(Path(path).resolve()), short_path(path)) if path else "?"


def _agree(question: str) -> bool:
    """Ask before paid work or a delete: ``No`` unless answered yes (Enter, or no terminal at all,
    is no: a paid run started on a bare Enter, and a closed input printed only click's "Aborted!")."""
    try:
        return click.confirm(question, default=False, err=True)
    except click.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):  # (click makes a Ctrl-C at a prompt its Abort)
            raise KeyboardInterrupt from None  # an interrupt, as anywhere else: "interrupted", exit 130
        _tell("")  # (the input ended: no answer, which is no)
        return False


def _cost_text(estimate: float | None, free: str = "free (offline model)") -> str:
    """An estimate as the questions before paid work word it (``None``: a price unknown)."""
    if estimate == 0:
        return free
    return (f"{about_money(estimate, 4)} (an estimate meant to err high)" if estimate is not None
            else "unknown (a model's price is not known)")


def _ask_before_paying(grid: list[Any], tokens: int, yes: bool, what: str) -> None:
    """Say what a replay or sweep on paid models should cost (or that the price is unknown) and
    ask before it starts, as an experiment does; the offline model is free and asks nothing.
    Declined (or no answer): a ``ClickException`` (under ``--json``, its JSON line)."""
    from .experiments import estimate_cost
    from .replay import configuration_problem

    runnable = [c for c in grid if not configuration_problem(c)]  # the others are refused without a call
    estimate = estimate_cost([tokens], runnable)
    if estimate == 0:  # the offline model, or nothing that can run here
        return
    _tell(f"{what}: cost {_cost_text(estimate)}")
    if not yes and not _agree("Start?"):
        raise click.ClickException("not started (pass --yes to start a paid replay without asking)")


def _print_summary(result: ReplayResult, probes: int | None = None, source: str = "", abstentions: int = 0,
                   no_gold: int | None = None) -> None:
    """The run's figures, each line under 100 columns; ``probes``: the conversation's probes, so
    that those not scored (no gold answer, as abstention questions; or evidence still in the final
    window, so nothing had to survive yet) are said, not silently dropped."""
    s = result.summary()
    state = s["status"]
    if result.partial:
        state += f" at step {s['steps']} of {s['planned_steps']} (figures below are partial: that prefix only)"
    click.echo(f"run {s['run_id'] or '(not recorded)'}: {state}" + (f" · {source}" if source else ""))
    spent = "cost unknown (a model's price is not known)" if s["cost_usd"] is None else f"cost {money(s['cost_usd'])}"
    click.echo(f"  messages {s['messages']}, reads {s['steps']}, observer calls {s['observer_calls']}, "
               f"reflector calls {s['reflector_calls']}, cache hits {s['cache_hits']}, {spent}")
    click.echo(f"  full history {s['full_history_tokens']:,} tokens -> final context {s['final_context_tokens']:,} "
               f"tokens: compression {ratio(s['compression'])}")
    waiting = s.get("probes_in_window", 0)
    if "retention" in s:
        no_gold = (probes or 0) - s["probes_scored"] - waiting
        reasons = [*([f"{no_gold} without a gold answer"] if no_gold > 0 else []),
                   *([f"{waiting} with their evidence still in the window"] if waiting else [])]
        click.echo(f"  retention {share(s['retention'])} over {count(s['probes_scored'], 'probe')}"
                   + (f" (not scored: {', '.join(reasons)})" if reasons else ""))
        click.echo(f"    the same questions on: full history {share(s['retention_full_history'])}, window only "
                   f"{share(s['retention_window_only'])}, newest {s['final_context_tokens']:,} tokens "
                   f"{share(s['retention_recent_tokens'])}")
        from .app_data import category_name

        for category, figures in s["retention_per_category"].items():
            click.echo(f"    {category_name(category):>26}: memory {share(figures['memory'])}  "
                       f"full {share(figures['full_history'])}  "
                       f"window {share(figures['window_only'])}  recent {share(figures['recent_tokens'])}  "
                       f"({count(int(figures['probes']), 'probe')})")
    elif waiting:
        _echo_wrapped(f"retention not scored: the evidence of {count(waiting, 'probe')} is still in the final window, "
                      f"so nothing has had to survive yet (a smaller --last-messages, or a longer conversation)",
                      first="  ", rest="  ")
    elif probes:  # (no probe scored, none waiting: it said nothing of them)
        if abstentions == probes:
            why = (f"{'it is' if probes == 1 else 'they are'} about something never said (abstention), which only "
                   "an LLM judge grades (--judge and --answerer)")
        elif no_gold == probes:
            why = "none has a gold answer to look for"
        else:  # (a gold answer of no word the score reads: "はい", "42%"…)
            why = "no gold answer has words the word-retention score can look for (an LLM judge can grade them)"
        _echo_wrapped(f"retention not scored: {count(probes, 'probe')}, and {why}", first="  ", rest="  ")
    click.echo(f"  elapsed {s['elapsed_s']:.2f} s")


def _resolve_prompt(store: RunStore | None, name: str, version: str | None) -> Prompt:
    from omem_core import OBSERVER_PROMPT, REFLECTOR_PROMPT
    from omem_core.prompts import BUILTIN_PROMPTS

    builtin = {prompt.version: prompt for prompt in BUILTIN_PROMPTS[name]}
    if version is None:
        return builtin[(OBSERVER_PROMPT if name == "observer" else REFLECTOR_PROMPT).version]
    if version in builtin:
        return builtin[version]
    if store is None:
        raise click.BadParameter(f"prompt {name}@{version} needs a run store to load from")
    try:
        return store.prompt(name, version)
    except KeyError as exc:
        saved = store.prompts()
        saved = list(saved[saved.name == name].version) if not saved.empty else []
        known = ", ".join([*sorted(builtin), *(v for v in saved if v not in builtin)])
        raise click.BadParameter(f"no {name} prompt version {version!r}: built in or saved in {store.path} "
                                 f"are {known}", param_hint=f"'--{name}-prompt'") from exc


class _Positive(click.IntRange):
    name = "integer"  # (click's "'abc' is not a valid integer range." read as if a range were asked for)


POSITIVE = _Positive(min=1)


class DatasetArg(click.Path):
    """A dataset file or folder, or the name ``python -m workbench datasets`` lists it under
    (``locomo-dev``, ``demo``): a path that exists wins over a name."""

    name = "path or name"

    def __init__(self) -> None:
        super().__init__(exists=True, path_type=Path)

    def get_metavar(self, *args, **kwargs) -> str:  # (click 8.2 added a ctx argument)
        return "PATH|NAME"

    def convert(self, value, param, ctx):
        if isinstance(value, Path) or Path(value).exists():
            return super().convert(value, param, ctx)
        entries = known_datasets()
        for entry in entries:
            if entry.name == value:
                return entry.path
        names = ", ".join(e.name for e in entries)
        self.fail(f"no file or folder {value!r}, and no dataset of that name (known: {names})", param, ctx)


DATASET = DatasetArg()


def _csv(kind):
    """A comma-separated option: each value checked as ``kind`` (a click type, e.g. ``POSITIVE``, or
    ``str``), so a bad one gets click's own message and exit code 2, naming the value; a value
    given twice counts once. The option may be repeated (``multiple=True``): its values join."""
    def convert(ctx, param, value):
        if isinstance(value, (tuple, list)):  # (the option repeated: each is a list too, joined; the
            value = ",".join(value) if value else None  # last one alone counted, the others dropped unsaid)
        if value is None:
            return None
        try:
            items = split_list(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
        if not items:
            raise click.BadParameter(f"expected at least one value, got {value!r}", ctx, param)
        if kind is str:
            values = items
        else:
            values = []
            for item in items:
                try:
                    number = click.INT.convert(item, param, ctx)  # "'abc' is not a valid integer"
                    values.append(kind.convert(number, param, ctx))  # "0 is not in the range x>=1"
                except click.BadParameter as exc:
                    raise click.BadParameter(f"{exc.message} (in {value!r})", ctx, param) from exc
        once = list(dict.fromkeys(values))  # a value given twice is one configuration, as in the app
        if len(once) < len(values):  # (said: "1000,1000" became one configuration without a word)
            _tell(f"note: {param.opts[0] if param is not None and param.opts else 'an option'} {value} repeats a "
                  f"value: each counts once ({', '.join(str(v) for v in once)})")
        return once
    return convert


def _grid_prompts_and_counter(command):
    """``--observer-prompt``, ``--reflector-prompt`` (lists, as the grid's other options) and
    ``--token-counter``, as ``sweep`` and ``experiment run`` take them."""
    for option in reversed((
            click.option("--observer-prompt", "observer_prompts", multiple=True, default=None, callback=_csv(str),
                         help="Comma-separated prompt versions (default: the newest built-in), or the option "
                              "repeated."),
            click.option("--reflector-prompt", "reflector_prompts", multiple=True, default=None, callback=_csv(str),
                         help="Comma-separated prompt versions (default: the newest built-in), or the option "
                              "repeated."),
            click.option("--token-counter", type=click.Choice(TOKEN_COUNTERS), default="heuristic",
                         show_default=True, help="How tokens are counted for thresholds and figures."))):
        command = option(command)
    return command


@click.group(cls=JsonGroup)
def cli() -> None:
    """omem workbench: replay conversations through observational memory and study the runs."""


@cli.command("replay")
@click.option("--dataset", "dataset", type=DATASET, default=DEMO_DATASET, show_default="demo",
              help="Dataset file or folder, or a name that `datasets` lists.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Override format detection.")
@click.option("--conversation", help="Conversation id (default: the first).")
@click.option("--observer", default=OFFLINE_MODEL, show_default=True, help="litellm model string.")
@click.option("--reflector", default=OFFLINE_MODEL, show_default=True, help="litellm model string, or 'none'.")
@click.option("--observation-threshold", type=POSITIVE, default=1000, show_default=True,
              help="Tokens of unobserved messages that trigger the observer (at most 16,000 here, the workbench's limit).")
@click.option("--reflection-threshold", type=POSITIVE, default=2000, show_default=True,
              help="Tokens of unreflected observations that trigger the reflector.")
@click.option("--last-messages", "--window", "last_messages", type=POSITIVE, default=10,
              show_default=True, help="Recall window: the newest messages kept verbatim.")
@click.option("--token-counter", type=click.Choice(TOKEN_COUNTERS), default="heuristic", show_default=True,
              help="How tokens are counted for thresholds and figures.")
@click.option("--recall-on", type=click.Choice(["assistant", "every"]), default="assistant", show_default=True,
              help="Read memory before each assistant message, or before every message.")
@click.option("--observer-prompt", help="Observer prompt version: a built-in one (v1, v2) or one saved in the "
              "app (default: the newest built-in).")
@click.option("--reflector-prompt", help="Reflector prompt version: a built-in one (v1, v2) or one saved in the "
              "app (default: the newest built-in).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds allowed to each compaction call.")
@click.option("--max-backlog", type=POSITIVE, help="Opt-in backlog ceiling in tokens: past it the "
              "observer takes larger segments so the backlog stops growing (default off).")
@click.option("--no-cache", is_flag=True, help="Do not serve repeated model calls from litellm's cache.")
@click.option("--answerer", help="LLM-judged retention: model that answers probes.")
@click.option("--judge", help="LLM-judged retention: model that grades answers.")
@click.option("--yes", is_flag=True, help="Do not ask before a paid replay or paid judge calls.")
@click.option("--resume", "resume", metavar="RUN_ID", help="Continue an interrupted or failed run.")
@click.option("--label", "--name", "label", help="A name for the run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line of stdout.")
@DB_OPTION
@json_errors
def replay_command(dataset: Path, fmt: str | None, conversation: str | None, observer: str, reflector: str,
                   observation_threshold: int, reflection_threshold: int, last_messages: int, token_counter: str,
                   recall_on: str, observer_prompt: str | None, reflector_prompt: str | None,
                   timeout: float | None, max_backlog: int | None, no_cache: bool, answerer: str | None,
                   judge: str | None, yes: bool, resume: str | None, label: str | None, as_json: bool,
                   db: str) -> None:
    """Replay one conversation and record every step."""
    from .datasets import load_conversation

    if bool(answerer) != bool(judge):
        raise click.UsageError("--judge and --answerer go together: --answerer is the model that answers the "
                               "probes, --judge the one that grades its answers")
    chosen = None
    if not resume:  # read before the model library loads (seconds): a file that cannot be read is said at once
        try:
            chosen = load_conversation(dataset, conversation, fmt)
        except ConversationNotFound as exc:  # (a refused option: exit 2, as experiment run's)
            raise click.BadParameter(str(exc), param_hint="--conversation") from None
        except WorkbenchError as exc:
            raise click.ClickException(str(exc)) from exc
    _loading_note()
    from .replay import ConfigurationError, ReplayConfig, ReplayFailed, replay, resume_refusal

    if answerer and judge:  # refused before the replay, not after it
        from .judge import unusable

        if trouble := unusable(answerer, judge):
            raise click.ClickException(f"cannot judge here: {trouble}")
    if resume:
        _refuse_with_resume(click.get_current_context(), RESUME_FIXES)
    with _using_store(db, existing=bool(resume)) as store:
        if resume:
            run = store.run(resume)
            if run["status"] == "completed":
                _tell(f"run {resume} is already completed: nothing to resume "
                      f"({cli_command('runs', store.path)} lists its figures)")
                if as_json:  # (the last stdout line is JSON, as promised)
                    _say_json({"run_id": resume, "status": "completed", "resumed": False})
                return
            conv = load_conversation(run["dataset"], run["conversation_id"], run["dataset_format"])
            if (refusal := resume_refusal(conv, store, resume)) is not None:  # (before the cost is asked)
                raise click.ClickException(refusal)
            config = ReplayConfig.from_json(run["config"])
        else:
            conv = chosen
            try:
                config = ReplayConfig(
                    observer=observer, reflector=None if reflector.lower() == "none" else reflector,
                    observation_threshold=observation_threshold, reflection_threshold=reflection_threshold,
                    last_messages=last_messages, token_counter=token_counter, recall_on=recall_on,
                    observer_prompt=_resolve_prompt(store, "observer", observer_prompt),
                    reflector_prompt=_resolve_prompt(store, "reflector", reflector_prompt),
                    timeout=timeout, cache=not no_cache, max_backlog=max_backlog)
            except ConfigurationError as exc:  # options that cannot go together: refused (exit 2), nothing run
                raise click.UsageError(str(exc)) from None
        for warning in conv.warnings:  # (named by conversation, as an experiment's are)
            _tell(f"warning: {terminal_text(conv.id)}: {warning}")
        from .datasets.base import ConversationInfo, rough_tokens

        tokens, what = ConversationInfo.of(conv).tokens, f"replay of {terminal_text(conv.id)}"
        if resume:  # what is left: the messages past the recorded cursor (not the whole conversation)
            steps = store.steps(resume)
            cursor = steps.cursor_index.dropna()
            left = conv.turns[int(cursor.iloc[-1]) + 1:] if not cursor.empty else conv.turns
            tokens = rough_tokens(left)
            what = f"rest of run {resume} ({count(len(left), 'message')} not yet observed)"
        _ask_before_paying([config], tokens, yes, what)
        known = set() if resume else set(store.runs().run_id)
        try:
            result = _run_async(replay(conv, config, store, resume=resume, label=label,
                                       progress=_progress_printer(f"replay {terminal_text(conv.id)}", as_json)))
        except ConfigurationError as exc:
            failure = click.ClickException(str(exc) + (f" (recorded as failed run {exc.run_id})" if exc.run_id else ""))
            failure.json_fields = {"run_id": exc.run_id, "error": str(exc)}  # type: ignore[attr-defined]
            raise failure from exc
        except ReplayFailed as exc:
            partial = exc.result
            _tell(f"error: {exc}")
            if exc.resumable:
                _tell(f"the run {partial.run_id} failed at step {partial.steps} of {partial.planned_steps} and "
                      f"kept its recorded steps; resume with: {cli_command(f'replay --resume {partial.run_id}', store.path)}")
            else:  # (a resume would stop at the same message)
                _tell(f"the run {partial.run_id} stopped at step {partial.steps} of {partial.planned_steps} on a "
                      "message of the dataset (recorded as failed, its steps kept): correct or re-date that "
                      "message in the dataset, then start a new replay")
            if as_json:
                _say_json(partial.summary(), code=1)
            sys.exit(1)
        except KeyboardInterrupt:
            interrupted_run = functools.cache(lambda: resume or _new_run(store, known))  # (read once)
            _exit_interrupted(lambda: _replay_interrupted(store, interrupted_run()),
                              f"\ninterrupted: what was recorded is kept; {cli_command('runs', db)} lists the run",
                              as_json=as_json, fields=lambda: {"run_id": interrupted_run()})
        if answerer and judge and conv.probes:
            _run_judge(store, result, conv, config, answerer, judge, yes, as_json)
        if as_json:
            _say_json(result.summary())
        else:
            import pandas as pd

            from .analysis import findings

            _print_summary(result, len(conv.probes), f"conversation {terminal_text(conv.id)} of {_dataset_name(conv.source)}",
                           sum(1 for p in conv.probes if p.gold is None and p.abstention),
                           sum(1 for p in conv.probes if p.gold is None))
            calls = store.model_calls(result.run_id) if result.run_id else None
            for note in findings(pd.DataFrame(result.step_rows), config.observation_threshold, calls,
                                 config.max_backlog, config.reflection_threshold if config.reflector else None,
                                 config.recall_on):
                _echo_wrapped(note, first="  note: ", rest="        ")


# What a resumed run takes from its recorded configuration (changing any of them mid-run would
# record one run made of two configurations).
RESUME_FIXES = ("dataset", "fmt", "conversation", "observer", "reflector", "observation_threshold",
                "reflection_threshold", "last_messages", "token_counter", "recall_on", "observer_prompt",
                "reflector_prompt", "timeout", "max_backlog", "no_cache", "label")


def _refuse_with_resume(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Refuse options given on the command line that a resumed run would silently ignore."""
    from click.core import ParameterSource

    given = [param.opts[0] for param in ctx.command.params
             if param.name in names and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(
            f"--resume continues a run with the configuration it was recorded with, so {', '.join(given)} "
            f"cannot be given with it (start a new run without --resume to use {'them' if len(given) > 1 else 'it'})")


def _run_async(coroutine: Any) -> Any:
    """``asyncio.run``, with Ctrl-C made safe for a command line.

    The first Ctrl-C cancels the work, whose clean-up records what was done (an interrupted run's
    last batch, the experiment's status) and ends an experiment's workers; further ones are
    ignored until that is over. asyncio's own handler raised ``KeyboardInterrupt`` at the second,
    wherever the loop was, so a Ctrl-C held down stopped that clean-up half-way: the workers
    outlived the command and the experiment stayed 'running'. The work cancelled by a Ctrl-C
    raises ``KeyboardInterrupt`` here, as usual.

    The model calls a Ctrl-C cancels before they started are coroutines never awaited, which
    Python reports as a ``RuntimeWarning`` per call when the loop closes: those warnings are dropped
    after an interrupt only (elsewhere they mean a bug)."""
    import asyncio
    import signal
    import threading
    import warnings

    from .interrupts import stopping

    running: dict[str, Any] = {}
    stopped = contextlib.ExitStack()

    def on_ctrl_c(signum: int, frame: Any) -> None:
        # (a handler can run again inside itself: mark first, so a nested one never drops the cancel)
        if running.get("stopping"):
            return
        running["stopping"] = True
        stopped.enter_context(stopping())  # the clean-up's writes wait briefly for a held run store
        task = running.get("task")
        if task is None or task.done():  # before the work started, or after it ended: stop as Python would
            raise KeyboardInterrupt
        # Cancelled here and now, as asyncio's own handler does: a callback scheduled for the loop
        # waited until the work next yielded to it, which an experiment collecting finished runs
        # did not do before its end (so the Ctrl-C was lost).
        task.cancel()
        running["loop"].call_soon_threadsafe(lambda: None)  # (wakes the loop if it is waiting)

    async def work() -> Any:
        running["loop"], running["task"] = asyncio.get_running_loop(), asyncio.current_task()
        try:
            return await coroutine
        finally:
            del running["task"]

    handled = threading.current_thread() is threading.main_thread()
    _before_ctrl_c.pop("handler", None)  # (one left by an earlier interrupted call is stale now)
    previous = signal.signal(signal.SIGINT, on_ctrl_c) if handled else None  # (asyncio's is then not set)
    interrupted = False
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught, asyncio.Runner() as runner:
            try:
                return runner.run(work())  # (its warnings are shown once the loop has closed)
            except asyncio.CancelledError:
                if running.get("stopping"):
                    raise KeyboardInterrupt from None
                raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
        raise
    finally:
        stopped.close()
        if handled:  # interrupted: Ctrl-C stays ignored until the command has said what it kept
            signal.signal(signal.SIGINT, signal.SIG_IGN if interrupted else previous)
            if interrupted:
                _before_ctrl_c["handler"] = previous  # (put back by _exit_interrupted)
        for w in caught:
            if not (interrupted and issubclass(w.category, RuntimeWarning) and "never awaited" in str(w.message)):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _quit_now(signum: int, frame: Any, code: int = 130) -> None:
    """A Ctrl-C while the program winds down (closing the store, Python's own shutdown): quit at
    once and quietly, with ``code`` (the command's own, once it has ended), instead of an
    "Exception ignored ... KeyboardInterrupt" traceback."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


_before_ctrl_c: dict[str, Any] = {}  # the SIGINT handler a Ctrl-C's clean-up replaced
_as_program = False  # set by main(): the command owns the process, not a caller (a test, a notebook)


def _exit_interrupted(message: str | Callable[[], str], fallback: str = "\ninterrupted", *,
                      as_json: bool = False, fields: Callable[[], dict[str, Any]] | None = None) -> None:
    """Leave after a Ctrl-C, saying what was kept. Everything is already recorded by then: a
    further Ctrl-C is ignored until the message (which may read the store, briefly: see
    :data:`workbench.interrupts.STOPPING_WAIT_S`; ``fallback`` is said when it cannot) is out.
    Run as the program, it then quits at once and quietly at a further Ctrl-C while the process
    winds down (closing the store, Python's own shutdown), where it used to print an "Exception
    ignored ... KeyboardInterrupt" traceback; called from other code, the handler found before
    the Ctrl-C is put back. With ``as_json`` stdout ends with ``{"status": "interrupted", "error":
    …}`` and ``fields()`` (the run's or experiment's id), as for any other ending."""
    import signal
    import threading

    from .interrupts import stopping

    handled = threading.current_thread() is threading.main_thread()
    if handled:  # (the handler to put back: the one _run_async replaced, else the one in place)
        in_place = signal.signal(signal.SIGINT, signal.SIG_IGN)
        saved = _before_ctrl_c.pop("handler", None)  # (used only while the Ctrl-C it was saved at holds)
        previous = saved if in_place == signal.SIG_IGN and saved is not None else in_place
        previous = signal.default_int_handler if previous is None else previous  # (None: set outside Python)
    extra: dict[str, Any] = {}
    if fields is not None and as_json:
        with contextlib.suppress(WorkbenchError), stopping():  # (an id that cannot be read is left out)
            extra = fields()
    if not isinstance(message, str):
        try:
            with stopping():
                message = message()
        except WorkbenchError as exc:  # (the run store held or unreadable: what was kept is not read)
            message = f"{fallback} ({exc})"
    _tell(message)
    if as_json:
        _say_json({"status": "interrupted", "error": " ".join(message.split()), **extra}, code=130)
    if handled:
        signal.signal(signal.SIGINT, _quit_now if _as_program else previous)
    sys.exit(130)


def _new_run(store: RunStore, known: set[str]) -> str | None:
    """The run a command just started: the one not in ``known`` before (None if not one)."""
    runs = store.runs()
    new = runs[~runs.run_id.isin(known)] if not runs.empty else runs
    return str(new.run_id.iloc[-1]) if len(new) == 1 else None


def _replay_interrupted(store: RunStore, run_id: str | None) -> str:
    """What a Ctrl-C during a replay kept. One landing just as the run ended finds it completed:
    it said "resume with" a run there was nothing left to resume of."""
    status = store.run(run_id)["status"] if run_id else None
    if status == "completed":
        return f"\ninterrupted after run {run_id} had completed: it is kept whole ({cli_command('runs', store.path)})"
    if run_id is None:
        return (f"\ninterrupted: what was recorded is kept; resume with: {cli_command('replay --resume RUN_ID', store.path)}"
                f" ({cli_command('runs', store.path)} lists it)")
    return f"\ninterrupted: what was recorded is kept; resume with: {cli_command(f'replay --resume {run_id}', store.path)}"


def _sweep_interrupted(store: RunStore, known: set[str]) -> str:
    """What a Ctrl-C during a sweep kept, and how to finish the runs it cut short (it said only
    "finished runs are kept")."""
    runs = store.runs()
    cut = runs[~runs.run_id.isin(known) & (runs.status != "completed")] if not runs.empty else runs
    if cut.empty:
        return "\ninterrupted: finished runs are kept"
    commands = "; ".join(cli_command(f"replay --resume {run_id}", store.path) for run_id in cut.run_id)
    return (f"\ninterrupted: finished runs are kept; {count(len(cut), 'run')} did not finish: "
            f"resume {'it' if len(cut) == 1 else 'each'} with: {commands}")


def _run_judge(store, result, conv, config, answerer, judge, yes, quiet) -> None:
    from . import judge as judging
    from .retention import render_context

    context = render_context(result.context)
    probes = judging.left_the_window(store, result.run_id, conv.probes)
    estimate = judging.estimate(probes, context, answerer, judge)
    _tell(f"LLM-judged retention: {estimate.describe()}")
    try:
        if estimate.cost_usd != 0 and not yes and not _agree("Run it?"):  # (free: offline)
            return
    except KeyboardInterrupt:  # (the replay is done and recorded: said, as a Ctrl-C while judging says it)
        _exit_interrupted(f"\ninterrupted: nothing was judged; run {result.run_id} is kept as replayed",
                          as_json=quiet, fields=lambda: {"run_id": result.run_id})
    costs: list[float | None] = []
    try:
        rows = _run_async(judging.judge_probes(probes, context, answerer=answerer, judge=judge, spent=costs.append))
    except KeyboardInterrupt:
        _exit_interrupted(f"\ninterrupted: no judged score was stored; run {result.run_id} is kept as replayed",
                          as_json=quiet, fields=lambda: {"run_id": result.run_id})
    except judging.JudgeFailed as exc:
        made = (f" ({count(len(costs), 'call')} made before it, cost "
                + ("unknown" if None in costs else money(judging.known_cost(costs))) + ")") if costs else ""
        failure = click.ClickException(f"{exc}; no judged score was stored{made}, run {result.run_id} is kept as "
                                       "replayed")
        # (the replay completed: its figures go with the failure, under "run")
        failure.json_fields = {"run_id": result.run_id, "error": str(exc),  # type: ignore[attr-defined]
                               "run": result.summary()}
        raise failure from None
    total = judging.total_cost(costs)
    store.record_judging(result.run_id, rows, len(costs), total)
    scores = [r["score"] for r in rows if r["score"] is not None]
    unread = len(rows) - len(scores)
    if rows and not quiet:
        spent = "cost unknown (a model's price is not known)" if total is None else f"cost {money(total, 4)}"
        accuracy = f"{sum(scores) / len(scores):.3f}" if scores else "none"
        click.echo(f"LLM-judged accuracy: {accuracy} over {count(len(scores), 'probe')} "
                   f"({count(len(costs), 'call')}, {spent})")
    if unread:  # (said even with --json: a judge off script is not a measurement)
        _tell(f"warning: {judging.unscored_note(unread)}")


@cli.command()
@click.option("--dataset", type=DATASET, default=DEMO_DATASET, show_default="demo",
              help="Dataset file or folder, or a name that `datasets` lists.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Override format detection.")
@click.option("--conversation", help="Conversation id (default: the first).")
@click.option("--observer", "observers", multiple=True, default=(OFFLINE_MODEL,), callback=_csv(str), show_default=True,
              help="Comma-separated litellm model strings, or the option repeated.")
@click.option("--reflector", "reflectors", multiple=True, default=(OFFLINE_MODEL,),
              callback=_csv(str), show_default=True,
              help="Comma-separated models, or 'none', or the option repeated.")
@click.option("--observation-threshold", "observation", multiple=True, default=("500,1000,2000",),
              callback=_csv(POSITIVE),
              show_default=True, help="Comma-separated observation thresholds in tokens, or the option repeated.")
@click.option("--reflection-threshold", "reflection", multiple=True, default=("1000,2000,4000",),
              callback=_csv(POSITIVE),
              show_default=True, help="Comma-separated reflection thresholds in tokens, or the option repeated.")
@click.option("--last-messages", "--window", "windows", multiple=True, default=("10",),
              callback=_csv(POSITIVE), show_default=True,
              help="Comma-separated recall windows (messages kept verbatim), or the option repeated.")
@_grid_prompts_and_counter
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True, help="Runs at once.")
@click.option("--yes", is_flag=True, help="Do not ask before a paid sweep starts.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line of stdout.")
@DB_OPTION
@json_errors
def sweep(dataset, fmt, conversation, observers, reflectors, observation, reflection, windows, observer_prompts,
          reflector_prompts, token_counter, concurrency, yes, as_json, db) -> None:
    """Replay a grid of configurations (bounded concurrency) into one run store.

    A configuration that fails (an unknown model, a missing key, a model error) is listed with
    its error; the others still run. A grid none of whose configurations can run here (no key)
    is refused before anything is recorded."""
    from .datasets import load_conversation

    try:  # read before the model library loads (seconds): a file that cannot be read is said at once
        conv = load_conversation(dataset, conversation, fmt)
    except ConversationNotFound as exc:  # (a refused option: exit 2)
        raise click.BadParameter(str(exc), param_hint="--conversation") from None
    except WorkbenchError as exc:
        raise click.ClickException(str(exc)) from exc
    _loading_note()
    from .replay import ReplayConfig, run_sweep

    with _using_store(db) as store:
        known = set(store.runs().run_id)  # (an interruption names the runs this sweep left unfinished)
        try:
            for warning in conv.warnings:
                _tell(f"warning: {terminal_text(conv.id)}: {warning}")
            from .experiments import config_grid, labels, offline_prompt_warning

            # (as an experiment's grid: without a reflector, one configuration per other setting,
            # not one per reflection threshold, each the same replay)
            try:
                grid = config_grid(
                    observers=observers, reflectors=[None if r.lower() == "none" else r for r in reflectors],
                    observation=observation, reflection=reflection, windows=windows,
                    observer_prompts=[_resolve_prompt(store, "observer", v) for v in observer_prompts or [None]],
                    reflector_prompts=[_resolve_prompt(store, "reflector", v) for v in reflector_prompts or [None]],
                    token_counter=token_counter)
            except ConfigurationError as exc:  # (refused, exit 2, as a replay's)
                raise click.UsageError(str(exc)) from None

            if warning := offline_prompt_warning(grid):
                _tell(f"warning: {warning}")

            # What varies names each configuration (a single one is named in full).
            short = labels([c.to_json() for c in grid]) if len(grid) > 1 else [c.label() for c in grid]
            names = {id(c): name for c, name in zip(grid, short)}
            from .replay import configuration_problem

            # As an experiment: a grid none of whose configurations can run is refused before
            # anything is asked or recorded (it recorded one failed run per configuration, each
            # error said twice); the others' failures are announced before they are recorded.
            problems = {name: configuration_problem(c) for name, c in zip(short, grid)}
            if all(problems.values()):
                raise click.ClickException("no configuration can run here: "
                                           + "; ".join(sorted({p for p in problems.values() if p})))
            for name, problem in problems.items():
                if problem:
                    _tell(f"warning: {name} cannot run here and will be recorded as failed: {problem}")

            def report(finished: int, total: int, config: ReplayConfig, result: ReplayResult) -> None:
                if as_json:
                    return
                if result.status == "completed":
                    figures = (f"compression {ratio(result.compression)}, retention "
                               f"{share(result.retention.retention if result.retention else None)}")
                else:
                    figures = f"failed at step {result.steps}: {result.error}"
                name = names.get(id(config), config.label())
                _tell(f"[{finished}/{total}] {result.run_id or '-'} {name}: {figures}")

            from .datasets.base import ConversationInfo

            _ask_before_paying(grid, ConversationInfo.of(conv).tokens, yes,
                               f"sweep of {count(len(grid), 'configuration')} on {terminal_text(conv.id)}")
            results = _run_async(run_sweep(conv, grid, store, concurrency, on_done=report))
            import pandas as pd

            from .analysis import falling_behind
            from .formatting import MISSING
            from .formatting import tokens as tokens_text

            def blind_spot(result: ReplayResult) -> float | None:  # the mean backlog per read, as experiments say
                backlog = [r["backlog_tokens"] for r in result.step_rows if r.get("backlog_tokens") is not None]
                return sum(backlog) / len(backlog) if backlog else None

            table = [{**r.summary(), "blind_spot_tokens": blind_spot(r), "config": config.label()}
                     for config, r in zip(grid, results)]
            if as_json:
                _say_json({"runs": table}, code=1 if any(r.status != "completed" for r in results) else 0)
            else:
                click.echo(f"{'run':<24} {'compr':>7} {'retention':>9} {'blind spot':>10} {'cost':>8} {'status':>10}  "
                           "configuration")
                behind = []
                for name, config, result in zip(short, grid, results):
                    row = result.summary()
                    done = result.status == "completed"
                    blind = blind_spot(result)
                    click.echo(f"{row['run_id'] or '-':<24} {ratio(row['compression'] if done else None):>7} "
                               f"{share(row.get('retention')):>9} "
                               f"{MISSING if blind is None else tokens_text(blind) + ' tok':>10} "
                               f"{money(row['cost_usd']):>8} {row['status']:>10}  {name}")
                    fell = falling_behind(pd.DataFrame(result.step_rows), config.observation_threshold) if done else None
                    behind += [(name, *fell)] if fell else []
                for name, final, part in behind:  # (26.4x read as the best compression, half the history seen nowhere)
                    _echo_wrapped(f"the observer fell behind in {name}: at the end, {final:,} tokens of messages "
                                  f"({part:.0%} of the history) are neither in memory nor in the window, and the "
                                  "backlog was still growing: that compression counts what the agent sees nowhere; "
                                  "`replay` of it says what to change", first="note: ", rest="      ")
                failed = [(c, r) for c, r in zip(grid, results) if r.status != "completed"]
                for config, result in failed:
                    _tell(f"failed: {names.get(id(config), config.label())}: {result.error}")
                if failed:
                    _tell(f"{len(failed)} of {len(grid)} configurations failed")
        except KeyboardInterrupt:
            _exit_interrupted(lambda: _sweep_interrupted(store, known), "\ninterrupted: finished runs are kept",
                              as_json=as_json)
    if any(r.status != "completed" for r in results):
        sys.exit(1)


@cli.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@DB_OPTION
@json_errors
def compare(run_a: str, run_b: str, as_json: bool, db: str) -> None:
    """Two runs side by side: calls, tokens, cost, compression, retention per category."""
    from .analysis import compare_runs, comparison_shown, display

    from .retention import scoring_note

    with _using_store(db, existing=True) as store:
        table = compare_runs(store, run_a, run_b)
        runs = [store.run(r) for r in (run_a, run_b)]
    conversations = [run["conversation_id"] for run in runs]
    if conversations[0] != conversations[1]:  # (named as A, B: a sorted pair read the wrong way round)
        _tell(f"warning: the two runs replayed different conversations (A {conversations[0]}, "
              f"B {conversations[1]}); their figures are not directly comparable")
    if note := scoring_note([run.get("scoring") for run in runs]):
        _tell(f"warning: {note}; to score both under the current rule, with no model call: "
              + cli_command("rescore --all", db))
    if as_json:
        click.echo(table.to_json(orient="columns"))
    else:  # the long configuration labels above the table, so that it fits a terminal
        for name, run_id in (("A", run_a), ("B", run_b)):
            click.echo(f"{name}  {run_id}: {display(table.at['configuration', run_id])}")
        shown = comparison_shown(table.drop(index="configuration"))
        shown.columns = [f"A {run_a}", f"B {run_b}"] if run_a != run_b else [f"A {run_a}"]
        click.echo(shown.to_string())


@cli.command("runs")
@click.option("--experiment", "experiment_id", metavar="ID",
              help="Only the runs of this experiment (their labels name only what varies within it).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@DB_OPTION
@json_errors
def runs_command(experiment_id: str | None, as_json: bool, db: str) -> None:
    """List the recorded runs, newest first."""
    from .formatting import runs_table

    if _no_store(db) and experiment_id is None:  # nothing recorded yet: say so without creating the file
        click.echo("[]" if as_json else f"no runs in {db} (no such file yet)")
        return
    with _using_store(db, existing=experiment_id is not None) as store:
        frame = store.runs()
        if experiment_id is not None:
            store.experiment(experiment_id)  # (an unknown one: an error naming it, not an empty list)
            frame = frame[frame.experiment_id == experiment_id].reset_index(drop=True)
    several = frame.experiment_id.dropna().nunique() if "experiment_id" in frame else 0
    columns = ["run_id", "status", "conversation_id", "messages", "steps", "compression", "retention", "label"]
    if as_json:  # (with what tells runs of two experiments apart: their ids, datasets, costs and times)
        more = ["created_at", "dataset", "experiment_id", "config_label", "planned_steps", "observer_calls",
                "reflector_calls", "cost_usd", "error", "scoring"]
        click.echo(frame[columns + more].to_json(orient="records", date_format="iso"))
    elif frame.empty:
        click.echo(f"no runs in {db}")
    else:  # the configuration in short, last and left-aligned (JSON has the whole label)
        from .app_data import run_name, short_config

        shown = runs_table(frame[[*[c for c in columns[:-1] if c != "messages"], "planned_steps"]]).rename(
            columns={"run_id": "run", "conversation_id": "conversation", "steps": "reads", "compression": "compr"})
        names = []
        for row in frame.to_dict("records"):  # a label given at replay first (it was not shown at all)
            name, short = run_name(row), short_config(row)
            names.append(short if name in (None, short) else f"{name} ({short})")
        lines = shown.to_string(index=False).splitlines()
        click.echo(f"{lines[0]}  configuration")
        for line, name in zip(lines[1:], names):
            if len(line) + 2 + len(name) <= 100:
                click.echo(f"{line}  {name}")
            else:  # a long status (a failed run's) and configuration: the configuration below, indented
                click.echo(line)
                click.echo(f"    {name}")
        from .retention import SCORING, is_earlier, scoring_rule

        earlier = [r for r in frame.itertuples() if is_earlier(r.scoring)]
        if earlier:  # (their retention is not comparable with the others')
            _echo_wrapped(f"{count(len(earlier), 'run')} scored under an earlier retention rule (rule "
                          f"{', '.join(sorted({str(scoring_rule(r.scoring)) for r in earlier}))}): "
                          f"{', '.join(r.run_id for r in earlier[:3])}{' …' if len(earlier) > 3 else ''}; their "
                          "retention is not comparable with the others'; to score them under the current rule, with "
                          "no model call: " + cli_command("rescore --all", db))
        if later := [r.run_id for r in frame.itertuples() if (scoring_rule(r.scoring) or 0) > SCORING]:
            _echo_wrapped(f"{count(len(later), 'run')} scored under a later retention rule than this version of omem "
                          f"knows (rules 1–{SCORING}): {', '.join(later[:3])}{' …' if len(later) > 3 else ''}; their "
                          "retention is not comparable with the others'; upgrade omem to read them")
        if several > 1:  # ("obs 1000" of two experiments read alike: their labels name what varies in each)
            click.echo(f"(runs of {several} experiments: `runs --experiment ID` lists one's, `experiment list` "
                       "names them)")


NOT_DELETED = "nothing deleted (pass --yes to delete without asking)"  # (it was click's bare "Aborted!")


@cli.command("delete")
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN_ID...")
@click.option("--yes", is_flag=True, help="Do not ask before deleting.")
@DB_OPTION
def delete_command(run_ids: tuple[str, ...], yes: bool, db: str) -> None:
    """Delete runs and everything recorded of them (a run of an experiment is then replayed again
    by `experiment resume`)."""
    from .formatting import missing

    run_ids = tuple(dict.fromkeys(run_ids))
    with _using_store(db, existing=True) as store:
        runs = [store.run(run_id) for run_id in run_ids]  # an unknown id: an error, and nothing deleted
        for run in runs:
            part = "" if missing(run.get("experiment_id")) else f" of experiment {run['experiment_id']}"
            _tell(f"run {run['run_id']}: {run['status']}, conversation {run['conversation_id']}{part}")
        if not yes and not _agree(f"Delete {count(len(runs), 'run')}?"):
            raise click.ClickException(NOT_DELETED)
        for run_id in run_ids:  # each in its own transaction: one another process is replaying stops here
            store.delete_run(run_id)
            click.echo(f"deleted run {run_id}")


@cli.command("rescore")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID]...")
@click.option("--experiment", "experiment_ids", multiple=True, metavar="ID",
              help="An experiment: all of its completed runs, in one write (repeatable).")
@click.option("--all", "every", is_flag=True, help="Every experiment and run scored under an earlier rule.")
@DB_OPTION
def rescore_command(run_ids: tuple[str, ...], experiment_ids: tuple[str, ...], every: bool, db: str) -> None:
    """Score recorded runs again under the current retention rule, from the run store, with no
    model call. Each run is first scored again under the rule it recorded, and is left as it is
    unless that gives back every recorded score. An experiment's runs are re-scored all together,
    and its later runs (a resume's) are scored under the current rule too. (A run recorded before
    message time offsets were kept reads them from its dataset if unchanged, else takes UTC.)"""
    from .rescore import RescoreError, earlier_runs, rescore_experiment, rescore_runs
    from .retention import SCORING, SCORING_RULES

    if not (run_ids or experiment_ids or every):
        raise click.UsageError("name runs (RUN_ID...), experiments (--experiment ID) or --all")
    failed = 0
    with _using_store(db, existing=True) as store:
        if every:
            old_experiments, old_runs = earlier_runs(store)
            experiment_ids = tuple(dict.fromkeys((*experiment_ids, *old_experiments)))
            run_ids = tuple(dict.fromkeys((*run_ids, *old_runs)))
            if not (experiment_ids or run_ids):
                click.echo(f"nothing to re-score: no run is scored under an earlier rule than rule {SCORING} "
                           f"({SCORING_RULES[SCORING]})")
                return
        for experiment_id in dict.fromkeys(experiment_ids):
            try:
                before = _experiment_rule(store, experiment_id)
                done = rescore_experiment(store, experiment_id)
            except WorkbenchError as exc:  # (cannot be re-scored, deleted meanwhile, an unknown id)
                failed += 1
                said = str(exc) if isinstance(exc, RescoreError) else f"experiment {experiment_id} was not re-scored: {exc}"
                _tell(f"error: {said}")
                continue
            if not done and before == SCORING:
                click.echo(f"experiment {experiment_id}: already scored under rule {SCORING}")
            else:
                click.echo(f"experiment {experiment_id}: {count(len(done), 'completed run')} re-scored under rule "
                           f"{SCORING}; its figures: {cli_command(f'experiment show {experiment_id}', store.path)}")
        for run_id in dict.fromkeys(run_ids):
            try:
                done = rescore_runs(store, [run_id])
            except WorkbenchError as exc:
                failed += 1
                _tell(f"error: {exc}")
                continue
            click.echo(done[0].describe() if done else f"run {run_id}: already scored under rule {SCORING}")
    if failed:
        raise click.ClickException(f"{count(failed, 'run or experiment', 'runs or experiments')} not re-scored "
                                   "(see above); everything else was")


def _experiment_rule(store: RunStore, experiment_id: str) -> int:
    """The retention scoring rule an experiment's runs are scored under."""
    from .experiments import experiment_rule

    return experiment_rule(store.experiment(experiment_id)["options"])


OVERWRITE_OPTION = click.option("--overwrite", is_flag=True, help="Replace Parquet files already in the folder.")


def export_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options both exports take: the folder, ``--overwrite`` and ``--json``."""
    command = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object (the files and their rows) instead of paths.")(command)
    command = OVERWRITE_OPTION(command)
    return click.option("--parquet", "folder", required=True, type=click.Path(),
                        callback=lambda ctx, param, value: _folder(value), help="Output folder.")(command)


def _export_folder_free(folder: Path, overwrite: bool) -> None:
    """Refuse a folder that already holds an export (another run's, say), unless ``overwrite``:
    its files were replaced without a word."""
    from .runstore import RUN_TABLES

    # (refused options, exit status 2 as the README says: they exited 1, "failed")
    if folder.exists() and not folder.is_dir():  # (it said "cannot create the export folder …: File exists")
        raise click.BadParameter(f"{folder} is a file, not a folder: the export writes one Parquet file per "
                                 "table into a folder; give a folder's path (made if missing)", param_hint="'--parquet'")
    held = [f"{t}.parquet" for t in ("experiments", *reversed(RUN_TABLES)) if (folder / f"{t}.parquet").exists()]
    if held and not overwrite:
        raise click.BadParameter(f"{folder} already holds {', '.join(held[:3])}{' …' if len(held) > 3 else ''} "
                                 "(an earlier export?): choose another folder, or pass --overwrite",
                                 param_hint="'--parquet'")


@cli.command()
@click.argument("run_id")
@export_options
@DB_OPTION
@json_errors
def export(run_id: str, folder: Path, overwrite: bool, as_json: bool, db: str) -> None:
    """Export one run's tables as Parquet files."""
    _export_folder_free(folder, overwrite)
    with _using_store(db, existing=True) as store:
        written = store.export_parquet(run_id, folder)
    _say_written(written, {"run_id": run_id}, as_json)


def _say_written(written: list[Path], about: dict[str, Any], as_json: bool) -> None:
    """The files an export wrote: their paths, one per line, or with ``--json`` one object naming
    each file's table and row count."""
    if not as_json:
        for path in written:
            click.echo(str(path))
        return
    import pyarrow.parquet as pq

    _say_json({"status": "completed", **about, "folder": str(written[0].parent) if written else None,
               "files": [{"table": path.stem, "path": str(path), "rows": pq.ParquetFile(path).metadata.num_rows}
                         for path in written]})


def _size(size: int) -> str:
    return f"{size / 1e6:,.1f} MB" if size >= 1e6 else f"{size / 1e3:,.0f} kB"


@cli.command("cache")
@click.option("--clear", is_flag=True, help="Delete every cached answer (asks first; --yes does not).")
@click.option("--yes", is_flag=True, help="Do not ask before clearing.")
def cache_command(clear: bool, yes: bool) -> None:
    """The model-call cache ($OMEM_CACHE_DIR, else ~/.cache/omem): where it is and what it holds;
    --clear empties it (it only grows: answers of every model and omem version are kept)."""
    import datetime

    from .cache import CacheUnavailable, cache_summary, clear_cache

    try:
        summary = cache_summary()
        if not summary["exists"]:
            click.echo(f"no model-call cache at {summary['path']} yet")
            return
        when = [datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else None
                for t in (summary["oldest"], summary["newest"])]
        span = f", {when[0]} to {when[1]}" if summary["answers"] else ""
        click.echo(f"model-call cache {summary['path']}: {count(summary['answers'], 'answer')}, "
                   f"{_size(summary['bytes'])}{span}")
        if not clear or not summary["answers"]:  # (an empty cache: nothing to ask about)
            return
        if not yes and not _agree(f"Delete {count(summary['answers'], 'cached answer')}?"):
            raise click.ClickException("nothing deleted (pass --yes to clear without asking)")
        deleted = clear_cache()
    except CacheUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"deleted {count(deleted, 'cached answer')}; the next calls ask their models again")


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path), metavar="[PATH]...")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def datasets(paths: tuple[Path, ...], as_json: bool) -> None:
    """List the datasets the workbench knows (project and ../shared), or check files or folders of
    your own: what each holds (conversations, messages, probes), or why it cannot be read (then,
    for paths given, the exit status is 1: a check a script can use)."""
    from .datasets import DatasetError, detect_format, list_conversations

    from .catalog import DatasetEntry, shared_datasets_dir

    if paths:  # (checking a file of one's own took setting OMEM_SHARED_DATASETS to its folder)
        entries = [DatasetEntry(path.name or str(path), path, None, "given") for path in paths]
    else:
        if not shared_datasets_dir().is_dir():
            _tell(f"(no shared datasets at {shared_datasets_dir()}; set OMEM_SHARED_DATASETS to add them)")
        entries = known_datasets()
    rows: list[dict[str, Any]] = []
    for entry in entries:
        row: dict[str, Any] = {"name": entry.name, "origin": entry.origin, "format": entry.format,
                               "path": str(entry.path)}
        try:
            listed = list_conversations(entry.path, entry.format)
            row["format"] = entry.format or detect_format(entry.path)  # (a path given: it said null)
        except DatasetError as exc:
            said = str(exc)  # (it names the file: once is enough)
            row["error"] = (said[len(exc.file):].lstrip(": ")
                            if said.startswith(exc.file) and Path(exc.file) == entry.path else said)
        else:
            # (gold: the probes with a gold answer word retention can score, one with a word; MemoryBank's have none)
            row.update(conversations=len(listed), messages=sum(c.messages for c in listed),
                       probes=sum(c.probes for c in listed), gold=sum(c.scored_probes for c in listed),
                       conversation_ids=[c.id for c in listed])
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows))
    else:
        width = max([20, *(len(e.name) for e in entries)])
        click.echo(f"{'name':<{width}} {'origin':<8} {'conversations':>13} {'messages':>8} {'probes':>6} {'gold':>6}  "
                   "path")
        for row in rows:
            where = short_path(row["path"])
            detail = (f"{'unreadable':<36}  {where}: {row['error']}" if "error" in row else
                      f"{row['conversations']:>13,} {row['messages']:>8,} {row['probes']:>6,} {row['gold']:>6,}  {where}")
            click.echo(f"{row['name']:<{width}} {row['origin']:<8} {detail}")
    bad = sum("error" in row for row in rows)
    if paths and bad:  # (the catalogue's listing is not a check: a broken shared file does not fail it)
        raise click.ClickException("the path given cannot be read (see above)" if len(rows) == 1 else
                                   f"{bad} of the {count(len(rows), 'path')} given cannot be read (see above)")


@cli.group()
def experiment() -> None:
    """Experiments: a dataset × a grid of configurations, run together, compared with confidence."""


def _experiment_progress(quiet: bool):
    """A progress line per finished run, with an ETA (on stderr: stdout stays for --json); the
    dataset's warnings about a conversation, with its first run, even when ``quiet`` (``--json``:
    no progress line on a log or a pipe; on a terminal there are, since long work with no line for
    seconds looked hung)."""
    quiet = quiet and not sys.stderr.isatty()

    def show(p) -> None:
        for warning in p.warnings:
            _tell(f"warning: {terminal_text(p.conversation_id)}: {warning}")
        if quiet or not p.finished:  # (a line per finished run; the app's bar follows the runs in flight)
            return
        width = 20
        filled = round(width * p.done / max(p.total, 1))
        bar = "█" * filled + "░" * (width - filled)
        eta = f", about {p.eta_s:,.0f} s left" if p.eta_s is not None and p.done < p.total else ""
        cost = f", ${p.cost_usd:.4f} spent" if p.cost_usd else ""
        state = "" if p.status == "completed" else f" ({p.status})"
        _tell(f"[{p.done}/{p.total}] {bar} {terminal_text(p.conversation_id)} · {p.label}{state}{cost}{eta}")

    return show


def _comparison_line(a: str, b: str, verdict: str, signed: bool, where: str = "") -> str:
    """``a vs b: <verdict>``, as `experiment show` and `experiment compare` both word it. A
    verdict that names the better one gives an unsigned size; only a ``signed`` one (no
    detectable difference, or too few probes for an interval) is said to be b minus a (beside a size, it read as the wrong sign)."""
    signed_as = f" ({b} minus {a})" if signed else ""
    return f"{a} vs {b}{where}{signed_as}: {verdict}"


def _unreplayable(store: Any, data: dict[str, Any]) -> str | None:
    """Why none of the runs a resume would replay can run here (a key unset, a model unknown),
    when that is so: "resume" would only be refused. ``None`` when some can, or none are left."""
    from . import experiments as ex

    if data["completed_runs"] >= data["planned_runs"]:
        return None
    blocked, every = ex.blocked_runs(store, data["experiment_id"])
    return "; ".join(sorted(set(blocked.values()))) if every else None


def _print_report(data: dict[str, Any], db: str, unreplayable: str | None = None) -> None:
    from .experiments import tally_text
    from .formatting import display, missing

    named = "" if missing(data.get("name")) else f" {terminal_text(str(data['name']))!r}"  # (not shown before)
    header = (f"experiment {data['experiment_id']}{named} ({data['status_text']}): "
              f"{count(len(data['conversations']), 'conversation')} of {short_path(data['dataset'])}, "
              + (f"{display(data['elapsed_s'])} s" if data["elapsed_s"] is not None
                 else "still running" if data["status"] == "running"
                 else "elapsed time not recorded (its process ended without a word)"))
    if data["completed_runs"] < data["planned_runs"]:
        header += (f"; the figures below come from the {data['completed_runs']} of {data['planned_runs']} "
                   f"planned runs that completed, on {count(data['completed_conversations'], 'conversation')}")
    _echo_wrapped(header)
    if data.get("error") and data["status"] != "completed":  # (it was only in the run store: why it stopped)
        _echo_wrapped(f"{'stopped' if data['status'] == 'stopped' else data['status']}: {terminal_text(data['error'])}")
    if note := data.get("scoring_note"):
        _echo_wrapped(f"note: {note}" + ("; to score it under the current rule, with no model call: "
                                         + cli_command(f"rescore --experiment {data['experiment_id']}", db)
                                         if data.get("rescorable") else ""))
    _print_config_table(data["configs"])
    shown = [c["cost_usd"] for c in data["configs"]]
    spent = data.get("spent_usd") or 0.0
    if spent and (None in shown or abs(spent - sum(shown)) > 1e-9):  # (the table counts completed runs only)
        _echo_wrapped(f"spent in all: {money(spent)} (calls whose price litellm knows, failed runs and runs a resume "
                      "replaced included; the cost column counts the completed runs)")
    judged = [c for c in data["configs"] if c.get("judge_calls")]
    if judged:  # (the cost column includes these calls)
        _echo_wrapped("LLM-judged accuracy: " + "; ".join(
            f"{c['label']} {display(c['judged_accuracy'])}" for c in judged)
            + f" (the cost includes {count(sum(c['judge_calls'] for c in judged), 'answerer and judge call')})")
        if unread := sum(c.get("judge_unscored") or 0 for c in judged):
            from .judge import unscored_note

            _echo_wrapped(f"warning: {unscored_note(unread)}")
    if data.get("uneven_note"):
        _echo_wrapped(data["uneven_note"])
    if data.get("backlog_note"):
        _echo_wrapped(data["backlog_note"])
    if asked := _probes_asked(data):
        _echo_wrapped(asked)
    _print_breakdown(data["configs"], data.get("per_conversation"))
    for comparison in data["comparisons"]:
        _echo_wrapped(_comparison_line(comparison["a"], comparison["b"], comparison["verdict"],
                                       comparison["retention_diff"] is not None and not comparison["detectable"])
                      + tally_text(comparison["a"], comparison["b"], comparison.get("conversations")))
    refused = data.get("dataset_failed_runs") or 0
    if refused:  # a resume would replay them to the same message: the dataset needs correcting
        _echo_wrapped(f"{count(refused, 'run')} stopped on a message of the dataset dated behind what was already "
                      "observed (the error above names it): correct or re-date that message in the dataset, then "
                      "start a new experiment; a resume would stop there again", err=True)
    if unreplayable and (data["failed_runs"] - refused or data.get("missing_runs")
                         or data["status"] in ("interrupted", "stopped", "failed")):
        _tell(f"the runs that did not complete cannot replay here ({terminal_text(unreplayable)}); once that is "
              "fixed, replay them with: " + cli_command(f"experiment resume {data['experiment_id']}", db))
    elif (data["failed_runs"] - refused or data.get("missing_runs")) and data["status"] == "completed":
        _tell("replay the runs that did not complete with: "
              + cli_command(f"experiment resume {data['experiment_id']}", db))
    elif data["status"] in ("interrupted", "stopped", "failed") and data["completed_runs"] < data["planned_runs"]:
        _tell("finish it with: " + cli_command(f"experiment resume {data['experiment_id']}", db))


def _print_config_table(configs: list[dict[str, Any]]) -> None:
    """The configurations' figures, a row each (``report()``'s ``configs``), as `experiment show`
    and `experiment compare` print them; a failed run's error on stderr below its row."""
    from .formatting import MISSING, display, tokens

    def ci(pair) -> str:
        return f"[{share(pair[0], 3)}, {share(pair[1], 3)}]" if pair else MISSING

    # A label longer than the column is written on a line of its own above its figures (cut, two
    # labels could read the same; in full, the table would not fit 100 columns).
    width = len("configuration")
    click.echo(f"{'configuration':<{width}} {'done':>5} {'probes':>6} {'retention':>9} {'95% CI':>14} "
               f"{'compr':>6} {'vs recency':>10} {'blind spot':>10} {'calls':>5} {'cost':>7}")
    for c in configs:
        blind = MISSING if c["blind_spot_tokens"] is None else f"{tokens(c['blind_spot_tokens'])} tok"
        label = c["label"]
        if len(label) > width:
            click.echo(label)
            label = ""
        done = f"{c['runs']}/{c['runs'] + c['failed'] + c.get('missing', 0)}"  # of the runs planned
        click.echo(f"{label:<{width}} {done:>5} {c['probes']:>6} "
                   f"{display(c['retention']):>9} {ci(c['retention_ci95']):>14} {ratio(c['compression']):>6} "
                   f"{display(c['recency_ratio']):>10} {blind:>10} {c['observer_calls'] + c['reflector_calls']:>5,} "
                   f"{money(c['cost_usd']):>7}")
        for error in c["errors"]:  # ("conv-26: message m55 cannot be replayed: …")
            _tell(f"    failed: {c['label']} on {error}")


def _probes_asked(data: dict[str, Any]) -> str | None:
    """What the probes column counts, when fewer than the conversations ask: "152 probes" of 199
    questions read as probes lost. ``None`` when all are scored or the dataset cannot be read."""
    from .datasets import DatasetError, list_conversations

    chosen = set(data["conversations"])
    try:
        listed = [c for c in list_conversations(data["dataset"], data.get("dataset_format")) if c.id in chosen]
    except DatasetError:
        return None
    completed = {row["conversation_id"] for row in data.get("per_conversation") or [] if row["status"] == "completed"}
    asked = sum(c.probes for c in listed)
    unrun = sum(c.probes for c in listed if c.id not in completed)  # (their runs failed: nothing was scored)
    with_gold = sum(c.scored_probes for c in listed if c.id in completed)
    scored = max((c["probes"] for c in data["configs"]), default=0)
    if not asked or scored >= asked:
        return None
    in_window = with_gold - scored  # (with gold, their evidence still in the final window: not scored)
    return (f"probes: those scored, of {count(asked, 'probe')} the conversations ask ("
            + "; ".join(part for part in (
                f"{unrun:,} in conversations no run completed" if unrun else "",
                f"{asked - unrun - with_gold:,} without a gold answer the word score can read (abstention "
                "questions, or a dataset that gives none)" if asked - unrun - with_gold else "",
                f"{in_window:,} whose evidence was still in the final window" if in_window > 0 else "") if part)
            + ")")


def _print_breakdown(configs: list[dict[str, Any]], conversations: list[dict[str, Any]] | None = None) -> None:
    """Per configuration, its retention per conversation (with several: their spread, which the
    pooled interval does not show), per probe category (with intervals) and its loss funnel."""
    from .formatting import display
    from .losses import STAGE_NAMES, STAGES

    for c in configs:
        categories = {name: figures for name, figures in (c.get("per_category") or {}).items() if figures["probes"]}
        funnel = c.get("funnel") or {}
        mine = [row for row in conversations or [] if row["label"] == c["label"]]
        scored = [row for row in mine if row["retention"] is not None]
        if not categories and not funnel.get("said") and len(mine) < 2:
            continue
        click.echo(f"{c['label']}:")
        if len(mine) > 1:
            spread = (f" (from {display(min(r['retention'] for r in scored))} to "
                      f"{display(max(r['retention'] for r in scored))})" if len(scored) > 1 else "")
            _echo_wrapped(f"by conversation{spread}: " + "; ".join(
                f"{row['conversation_id']} "
                + (f"{display(row['retention'])} ({count(row['probes'], 'probe')}, {ratio(row['compression'])})"
                   if row["retention"] is not None else
                   f"no probe scored ({ratio(row['compression'])})" if row["status"] == "completed" else row["status"])
                for row in mine), first="  ")
        if categories:
            _echo_wrapped("by category: " + "; ".join(
                f"{name} {display(f['retention'])}"
                + (f" [{share(f['retention_ci95'][0], 3)}, {share(f['retention_ci95'][1], 3)}]"
                   if f.get("retention_ci95") else "")
                + f" ({count(f['probes'], 'probe')})" for name, f in categories.items()), first="  ")
        if funnel.get("said"):
            elsewhere = funnel.get("visible_elsewhere") or 0
            _echo_wrapped("loss funnel (probes): " + " → ".join(f"{STAGE_NAMES[stage]} {funnel[stage]}"
                                                                for stage in STAGES)
                          + (f" (and {elsewhere} visible from other messages or common words)" if elsewhere else ""),
                          first="  ")


@experiment.command("run")
@click.option("--dataset", type=DATASET, required=True,
              help="Dataset file or folder, or a name that `datasets` lists (e.g. locomo-dev).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Override format detection.")
@click.option("--conversation", "conversations", multiple=True, help="A conversation id (repeat; default: all).")
@click.option("--observation-threshold", "observation", multiple=True, default=("1000",),
              callback=_csv(POSITIVE), show_default=True,
              help="Comma-separated observation thresholds in tokens, or the option repeated.")
@click.option("--reflection-threshold", "reflection", multiple=True, default=("2000",),
              callback=_csv(POSITIVE), show_default=True,
              help="Comma-separated reflection thresholds in tokens, or the option repeated.")
@click.option("--window", "--last-messages", "windows", multiple=True, default=("10",),
              callback=_csv(POSITIVE), show_default=True,
              help="Comma-separated recall windows (messages kept verbatim), or the option repeated.")
@click.option("--observer", "observers", multiple=True, default=(OFFLINE_MODEL,), callback=_csv(str), show_default=True,
              help="Comma-separated litellm model strings, or the option repeated.")
@click.option("--reflector", "reflectors", multiple=True, default=(OFFLINE_MODEL,),
              callback=_csv(str), show_default=True,
              help="Comma-separated models, or 'none', or the option repeated.")
@_grid_prompts_and_counter
@click.option("--max-backlog", "max_backlogs", multiple=True, default=("off",), show_default=True,
              help="Comma-separated backlog ceilings in tokens, or 'off' (see replay --max-backlog); the option "
                   "may be repeated.")
@click.option("--judge", help="LLM-judged accuracy: the model that grades answers (with --answerer).")
@click.option("--answerer", help="LLM-judged accuracy: the model that answers the probes (with --judge).")
@click.option("--concurrency", type=click.IntRange(1, 256), default=2, show_default=True,
              help="Runs at once (offline: worker processes; remote models: concurrent calls).")
@click.option("--max-cost", type=click.FloatRange(min=0, min_open=True), help="Stop cleanly past this many USD.")
@click.option("--rpm", type=click.FloatRange(min=0, min_open=True), help="Requests per minute per model.")
@click.option("--num-retries", type=click.IntRange(0, 20), default=2, show_default=True,
              help="litellm's retries with backoff (rate limits, transient errors).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds allowed to each compaction call.")
@click.option("--api-base", help="An OpenAI-compatible server for the remote models (e.g. a local one).")
@click.option("--no-traces", is_flag=True, help="Do not store each call's request and response.")
@click.option("--no-cache", is_flag=True, help="Do not use litellm's cache (nor share identical calls).")
@click.option("--name", "--label", "name", help="A name for the experiment.")
@click.option("--yes", is_flag=True, help="Do not ask before a paid experiment starts.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line of stdout.")
@DB_OPTION
@json_errors
def experiment_run(dataset, fmt, conversations, observation, reflection, windows, observers, reflectors,
                   observer_prompts, reflector_prompts, token_counter, max_backlogs, judge, answerer, concurrency, max_cost, rpm,
                   num_retries, timeout, api_base, no_traces, no_cache, name, yes, as_json, db) -> None:
    """Run a dataset × a grid of configurations (every combination of the values given)."""
    from .datasets import list_conversations

    if bool(judge) != bool(answerer):  # (refused before anything is read, as replay's are: exit 2)
        raise click.UsageError("--judge and --answerer go together: --answerer is the model that answers the "
                               "probes, --judge the one that grades its answers")

    try:  # read before the model library loads (seconds): a file that cannot be read is said at once
        listed = {c.id: c for c in list_conversations(dataset, fmt)}
    except WorkbenchError as exc:
        raise click.ClickException(str(exc)) from exc
    _loading_note()
    from . import experiments as ex

    with _using_store(db) as store:
        try:
            grid = ex.config_grid(
                observers=observers, reflectors=[None if r.lower() == "none" else r for r in reflectors],
                observation=observation, reflection=reflection, windows=windows,
                observer_prompts=[_resolve_prompt(store, "observer", v) for v in observer_prompts or [None]],
                reflector_prompts=[_resolve_prompt(store, "reflector", v) for v in reflector_prompts or [None]],
                token_counter=token_counter, timeout=timeout, cache=not no_cache,
                max_backlogs=_backlogs(",".join(max_backlogs)))
        except ConfigurationError as exc:  # options that cannot go together: refused (exit 2), nothing run
            raise click.UsageError(str(exc)) from None
        options = ex.ExperimentOptions(concurrency=concurrency, max_cost=max_cost, rpm=rpm, num_retries=num_retries,
                                       timeout=timeout, traces=not no_traces, cache=not no_cache, api_base=api_base,
                                       judge=judge, answerer=answerer)
        from .replay import configuration_problem

        warning = ex.offline_prompt_warning(grid)
        if warning:
            _tell(f"warning: {warning}")
        names = ex.labels([c.to_json() for c in grid])  # as the report will name them
        problems = {name: configuration_problem(c) for name, c in zip(names, grid)}
        if all(problems.values()):  # nothing could run: refuse before asking anything
            raise ex.ExperimentError("no configuration can run here: "
                                     + "; ".join(sorted({p for p in problems.values() if p})))
        for label, problem in problems.items():
            if problem:
                _tell(f"warning: {label} cannot run here and will be recorded as failed: {problem}")
        try:  # (an unknown id is a refused option: exit 2, as a bad threshold is)
            chosen = ex.choose_conversations(list(listed), conversations, dataset)  # before announcing the plan
        except ex.ExperimentError as exc:
            raise click.BadParameter(str(exc), param_hint="--conversation") from None
        if unscored := ex.unscored_warning([listed[c] for c in chosen]):
            _tell(f"warning: {unscored}")
        if judge and answerer:  # (the judging comes after every replay: refused now, not then)
            from .judge import unusable

            if trouble := unusable(answerer, judge):
                raise ex.ExperimentError(f"cannot judge here: {trouble}")
        runnable = [c for n, c in zip(names, grid) if not problems[n]]  # the others make no call: cost nothing
        estimate = ex.estimate_cost([listed[c].tokens for c in chosen if c in listed], runnable)
        judging = (ex.estimate_judging([listed[c] for c in chosen], runnable, answerer, judge)
                   if judge and answerer else 0.0)
        estimate = None if estimate is None or judging is None else estimate + judging
        runs = len(chosen) * len(grid)
        cost = _cost_text(estimate)
        if judge and answerer and judging != 0:
            cost += f", judging included ({answerer} answers, {judge} grades: 2 calls per probe)"
        _tell(f"{count(runs, 'run')}: {count(len(chosen), 'conversation')} × "
              f"{count(len(grid), 'configuration')}; cost {cost}")
        if estimate is None and max_cost is not None:
            _tell("warning: --max-cost counts only the calls whose price litellm knows: the others are not "
                  "counted, so the limit may not stop this experiment")
        if estimate != 0 and not yes and not _agree("Start?"):  # (None: unknown price)
            raise click.ClickException("not started (pass --yes to start a paid experiment without asking)")
        if same_name := ex.name_warning(store, name):
            _tell(f"warning: {same_name}")
        experiment_id = ex.create_experiment(store, dataset=dataset, grid=grid, options=options,
                                             conversations=chosen, dataset_format=fmt, name=name)
        _tell(f"experiment {experiment_id}")
        _finish_experiment(store, experiment_id, as_json)


def _backlogs(text: str) -> list[int | None]:
    from .app_data import parse_backlogs

    try:
        return parse_backlogs(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-backlog") from None


def _finish_experiment(store, experiment_id: str, as_json: bool) -> None:
    from . import experiments as ex

    try:
        outcome = _run_async(ex.run_experiment(store, experiment_id, progress=_experiment_progress(as_json)))
    except KeyboardInterrupt:
        def message() -> str:  # (a Ctrl-C just as the last run was collected: it had completed)
            if store.experiment(experiment_id)["status"] == "completed":
                return (f"\ninterrupted after experiment {experiment_id} had completed: "
                        + cli_command(f"experiment show {experiment_id}", store.path))
            return ("\ninterrupted: finished runs are kept; finish with: "
                    + cli_command(f"experiment resume {experiment_id}", store.path))

        _exit_interrupted(message, as_json=as_json, fields=lambda: {"experiment_id": experiment_id})
    data = ex.report(store, experiment_id)
    code = 1 if outcome.status != "completed" or outcome.failed else 0
    if as_json:
        _say_json(data, code=code)
    else:
        _print_report(data, store.path, _unreplayable(store, data))
    if outcome.error:
        _tell(f"{outcome.status}: {outcome.error}")
    if code:
        sys.exit(code)


@experiment.command("resume")
@click.argument("experiment_id")
@click.option("--max-cost", type=click.FloatRange(min=0, min_open=True),
              help="A new cost limit in USD (an experiment stopped by its limit needs a higher one).")
@click.option("--yes", is_flag=True, help="Do not ask before paid work resumes.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@DB_OPTION
@json_errors
def experiment_resume(experiment_id: str, max_cost: float | None, yes: bool, as_json: bool, db: str) -> None:
    """Finish what an interrupted or stopped experiment left undone (same grid, same options)."""
    with _using_store(db, existing=True) as store:
        from . import experiments as ex

        if store.experiment(experiment_id)["status"] == "completed" and not ex.pending_tasks(store, experiment_id):
            _tell(f"every run of experiment {experiment_id} is already completed: nothing to resume "
                  f"({cli_command(f'experiment show {experiment_id}', db)})")
            if as_json:  # (the last stdout line is JSON, as promised; as `replay --resume` says it)
                _say_json({"experiment_id": experiment_id, "status": "completed", "resumed": False})
            return
        options = store.experiment(experiment_id)["options"]
        if options.get("judge") and options.get("answerer"):  # checked before the start, as a new one's
            from .judge import unusable

            if trouble := unusable(options["answerer"], options["judge"]):
                raise ex.ExperimentError(f"cannot judge here: {trouble}")
        # Runs whose configuration cannot run here (a key unset since): refused when nothing else is
        # left, as a new experiment is (a paid model without its key read "cost free" and failed).
        blocked, every = ex.blocked_runs(store, experiment_id)
        if every:
            raise ex.ExperimentError("no run left can replay here: " + "; ".join(sorted(set(blocked.values()))))
        if (changed := ex.dataset_changed(store, experiment_id)) is not None:  # (before the cost is asked)
            raise ex.ExperimentError(f"experiment {experiment_id} cannot be resumed: {changed}")
        if (reached := ex.limit_reached(store, experiment_id, max_cost)) is not None:
            spent, limit = reached
            raise ex.ExperimentError(
                f"experiment {experiment_id} has spent ${spent:.4f} of its ${limit:.4f} cost limit, and a resume "
                "would stop again at its first paid call: give it a higher limit, e.g. "
                + cli_command(f"experiment resume {experiment_id} --max-cost {ex.higher_limit(spent, limit):g}", db))
        for label, problem in blocked.items():
            _tell(f"warning: {label} cannot run here and will be recorded as failed: {problem}")
        # What is left, and what it should cost, asked as a new experiment asks (a resume of a paid
        # one started unasked: the spend of the rest of a grid, or of the judging still owed).
        runs, judged, estimate = ex.estimate_resume(store, experiment_id)
        _tell(f"{count(runs, 'run')} left to replay" + (f", {count(judged, 'run')} to judge" if judged else "")
              + f"; cost {_cost_text(estimate, free='free')}")
        if estimate != 0 and not yes and not _agree("Resume?"):
            raise click.ClickException("not resumed (pass --yes to resume a paid experiment without asking)")
        if max_cost is not None:
            store.update_experiment_options(experiment_id, max_cost=max_cost)
        _finish_experiment(store, experiment_id, as_json)


@experiment.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@DB_OPTION
@json_errors
def experiment_list(as_json: bool, db: str) -> None:
    """The recorded experiments, newest first."""
    from .app_data import _grid_of

    if _no_store(db):  # nothing recorded yet: say so without creating the file
        click.echo("[]" if as_json else f"no experiments in {db} (no such file yet)")
        return
    with _using_store(db) as store:
        frame = store.experiments()
    columns = ["experiment_id", "status", "name", "dataset", "planned_runs", "runs", "unfinished_runs", "created_at"]
    from .experiments import experiment_rule, listed_status

    if as_json:
        listed = frame[[*columns, "failed_runs"]].assign(status_text=[listed_status(r) for r in frame.to_dict("records")],
                                                         grid=frame.configs.map(_grid_of),
                                                         scoring=frame.options.map(experiment_rule))
        click.echo(listed.to_json(orient="records", date_format="iso"))
    elif frame.empty:
        click.echo(f"no experiments in {db}")
    else:
        from .formatting import MISSING, missing

        status = [listed_status(row) for row in frame.to_dict("records")]
        shown = frame[columns].assign(created_at=frame.created_at.dt.strftime("%Y-%m-%d %H:%M"),
                                      dataset=frame.dataset.map(_dataset_name), status=status)
        shown = shown.rename(columns={"experiment_id": "experiment", "planned_runs": "planned",
                                      "runs": "recorded", "unfinished_runs": "not completed",
                                      "created_at": "created"})
        shown["grid"] = frame.configs.map(_grid_of)  # (what tells experiments of one dataset apart)
        click.echo(shown.astype(object).map(lambda v: MISSING if missing(v) else v).to_string(
            index=False, formatters={"grid": lambda v: f"  {v}"}))
        from .retention import is_earlier

        earlier = [e for e, o in zip(frame.experiment_id, frame.options) if is_earlier(experiment_rule(o))]
        if earlier:
            _echo_wrapped(f"scored under an earlier retention rule: {', '.join(earlier)}; to score them under the "
                          "current rule, with no model call: " + cli_command("rescore --all", db))


@experiment.command("show")
@click.argument("experiment_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@DB_OPTION
@json_errors
def experiment_show(experiment_id: str, as_json: bool, db: str) -> None:
    """Figures per configuration (pooled retention with its 95% CI, compression, calls, cost)."""
    from . import experiments as ex

    with _using_store(db, existing=True) as store:
        data = ex.report(store, experiment_id)
        unreplayable = None if as_json else _unreplayable(store, data)
    _say_json(data) if as_json else _print_report(data, db, unreplayable)


@experiment.command("compare")
@click.argument("experiment_id")
@click.option("--a", "label_a", help="A configuration's label, or its number in the grid from 1 (default: the first).")
@click.option("--b", "label_b", help="Another configuration's label or number (default: the second).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@DB_OPTION
@json_errors
def experiment_compare(experiment_id: str, label_a: str | None, label_b: str | None, as_json: bool, db: str) -> None:
    """Two configurations side by side (retention, compression, cost…, on the conversations both
    completed), and their difference in retention on the same probes with a paired-bootstrap 95% CI."""
    from . import experiments as ex

    with _using_store(db, existing=True) as store:
        experiment = store.experiment(experiment_id)
        names = [c["label"] for c in experiment["configs"]]
        if len(names) < 2 and not (label_a and label_b):
            raise ex.ExperimentError(f"{experiment_id} has one configuration; nothing to compare")
        picked = []
        for hint, given, default in (("--a", label_a, names[0]), ("--b", label_b, names[-1] if len(names) < 2
                                                                                   else names[1])):
            try:  # (a label it does not have is a refused option: exit 2)
                picked.append(ex.resolve_label(names, given, experiment_id) if given else default)
            except ex.ExperimentError as exc:
                raise click.BadParameter(str(exc), param_hint=hint) from None
        if picked[0] == picked[1]:
            raise click.UsageError(f"both sides are {picked[0]!r}: name two different configurations")
        diff = ex.compare(store, experiment_id, *picked)
        runs, probes = store.experiment_runs(experiment_id), store.experiment_probes(experiment_id)
        tally = ex.conversation_tally(probes, diff.a, diff.b)
        rule = _experiment_rule(store, experiment_id)
        note, rescorable = ex.rule_note(experiment, runs)
        # The two rows on the conversations both completed, as the paired difference pairs them (one
        # side's extra conversations would move its pooled figures and not the other's).
        shared = ex.shared_conversations(runs, [diff.a, diff.b])
        by_label = {s.label: s for s in ex.summaries_of(experiment, runs, probes, store.experiment_losses(experiment_id),
                                                        conversations=shared)}
        rows = [ex.config_figures(by_label[label]) for label in (diff.a, diff.b)]
    done = runs[runs.status == "completed"]
    completed = {label: done[done.config_label == label].conversation_id.nunique() for label in (diff.a, diff.b)}
    uneven, total = None, len(experiment["conversations"])
    if len(shared) < total:  # (the rows' "done" counts the shared ones: 3/3 where `show` says 3/5)
        uneven = (f"{diff.a} completed {completed[diff.a]:,} and {diff.b} {completed[diff.b]:,} of the experiment's "
                  f"{count(total, 'conversation')}: " + (f"both rows are on the {len(shared):,} both completed"
                                                          if shared else "none in common, nothing to set side by side"))
    configs = {c["label"]: c["config"] for c in experiment["configs"]}
    prompts = ex.offline_prompt_roles([configs[diff.a], configs[diff.b]])
    if note:
        _tell(f"note: {note}" + ("; to score it under the current rule, with no model call: "
                                      + cli_command(f"rescore --experiment {experiment_id}", db) if rescorable else ""))
    if prompts:  # (the app's Compare page says so too)
        _tell(f"note: they differ in {' and '.join(prompts)} prompt versions, which the built-in offline model "
              "ignores: any difference comes from their other settings")
    if as_json:
        _say_json({"a": diff.a, "b": diff.b, "probes": diff.probes, "retention_diff": diff.difference,
                   "ci95": list(diff.ci95) if diff.ci95 else None, "verdict": diff.verdict(),
                   "conversations": tally, "scoring": rule, "shared_conversations": shared,
                   "configs": [{k: v for k, v in row.items() if k != "errors"} for row in rows]})
        return
    if uneven:
        _echo_wrapped(f"note: {uneven}")
    if shared:
        _print_config_table(rows)
    _echo_wrapped(_comparison_line(diff.a, diff.b, diff.verdict(), diff.difference is not None and not diff.detectable,
                                   f" on {count(diff.probes, 'shared probe')}") + ex.tally_text(diff.a, diff.b, tally))


@experiment.command("delete")
@click.argument("experiment_id")
@click.option("--yes", is_flag=True, help="Do not ask before deleting.")
@DB_OPTION
def experiment_delete(experiment_id: str, yes: bool, db: str) -> None:
    """Delete an experiment and every run it recorded."""
    from .formatting import missing

    with _using_store(db, existing=True) as store:
        experiment = store.experiment(experiment_id)
        runs = store.experiment_runs(experiment_id)
        name = "" if missing(experiment.get("name")) else f" ({experiment['name']})"
        _tell(f"experiment {experiment_id}{name}: {experiment['status']}, {count(len(runs), 'run')} recorded")
        if not yes and not _agree(f"Delete it and its {count(len(runs), 'run')}?"):
            raise click.ClickException(NOT_DELETED)
        store.delete_experiment(experiment_id)
    click.echo(f"deleted experiment {experiment_id} and {count(len(runs), 'run')}")


@experiment.command("export")
@click.argument("experiment_id")
@export_options
@DB_OPTION
@json_errors
def experiment_export(experiment_id: str, folder: Path, overwrite: bool, as_json: bool, db: str) -> None:
    """The experiment and its runs' tables as Parquet files."""
    from . import experiments as ex

    _export_folder_free(folder, overwrite)
    with _using_store(db, existing=True) as store:
        try:
            written = ex.export_parquet(store, experiment_id, folder)
        except OSError as exc:
            raise click.ClickException(f"cannot write to {folder}: {exc}") from exc
    _say_written(list(written), {"experiment_id": experiment_id}, as_json)


@cli.command()
@click.option("--port", type=int, default=8501, show_default=True, help="Port to serve the app on.")
@click.option("--headless", is_flag=True, help="Do not open a browser.")
@DB_OPTION
def app(port: int, headless: bool, db: str) -> None:
    """Open the Streamlit workbench (this process becomes the Streamlit server)."""
    os.environ["OMEM_DB"] = str(Path(db).resolve()) if db != ":memory:" else db  # the server's run store
    command = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
               "--browser.gatherUsageStats", "false"]
    if headless:
        command += ["--server.headless", "true"]
    sys.stdout.flush()
    sys.stderr.flush()
    # exec, not a child: a signal to this process reaches the server itself, so stopping it
    # never leaves an orphan holding the port and the run store.
    os.execv(sys.executable, command)


def main() -> None:
    global _as_program
    _as_program = True
    code = 1  # (an exception past click: a bug)
    try:
        cli(prog_name="python -m workbench")
    except SystemExit as exc:  # how click ends every command
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        raise
    finally:  # the command has ended and said so: a Ctrl-C from here on only hurries the exit, with its code
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, functools.partial(_quit_now, code=code))
