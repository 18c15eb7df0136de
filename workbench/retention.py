"""Model-free retention: does the gold answer survive in what the agent would see?

A probe's score is the share of its gold answer's content words (lower-cased alphanumeric
words, common stop words removed) present in the visible text. What the agent sees is read as
*lines* with their dates: a message is a line dated by its timestamp (the day at the offset it was
written with, not the clock time: "13:56" would hand a gold answer of "13" a word it never had),
and a note line by a date stamping it ("- (7 May 2023) Ana: …") or else by the date heading above
it (a line holding a whole date and at most its weekday, a time, "Date:" or "Session 3": "8 May
2023", as the observer prompts ask; any spelling reads as the same date).

Scoring rules (:data:`SCORING_RULES`; a run records the one it was scored with, and an experiment
scores every run with the rule it started with, so no figure pools two):

1. every word counts, dates included: a line's date counts for every question wherever it is
   written, so "How many siblings? 2" scored 1.0 on a conversation with a message dated the 2nd;
2. (the current rule, :data:`SCORING`) a line's words count for every question, but its *date*
   counts only for a question it shares a distinctive word with: a word of the question said in at
   most one in ten of the conversation's messages, or in one (speakers' names, said in about half,
   are not distinctive). "When did Caroline go to the support group?" is credited the date of a line about
   the support group, not of every line of that day. A date written into a line ("yesterday
   (7 May 2023)") is part of the line and always counts.

Retention measures what survives once a probe's evidence has left the window: a probe whose
evidence messages are all still in the final window is not scored (its row says
``evidence_in_window``), by any method, so memory and baselines pool the same probes.

Baselines, scored the same way: *full history* (no compaction), *window only* (no memory), and
*recent tokens* (the newest K tokens of history, K = the final context's size).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import regex

if TYPE_CHECKING:
    from omem_core import Message

# Words are runs of letters (with their combining marks: Devanagari vowel signs, Hebrew points)
# and digits in any script — "zürich", "миша", "हिन्दी" — compared after NFKC normalisation and
# case folding. Chinese and Japanese are written without spaces and the scorer has no segmenter:
# a Han character is a word of its own ("東京" is retained when 東 and 京 both are), a run of
# katakana (names, loanwords: "コーヒー") is one word, and hiragana (particles, inflections) is
# not read — a gold answer written only in hiragana is left unscored rather than matched on
# particles.
_WORD = regex.compile(r"\p{Han}|[\p{Katakana}\u30fc]+|(?:(?![\p{Han}\p{Hiragana}\p{Katakana}\u30fc])[\p{L}\p{N}\p{M}])+")

STOP_WORDS = frozenset(
    """a an the and or but if of at by for with about against between into through during before after
    above below to from up down in out on off over under again further then once here there when where
    why how all any both each few more most other some such no nor not only own same so than too very
    s t can will just don should now is are was were be been being have has had having do does did doing
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her
    hers herself it its itself they them their theirs themselves what which who whom this that these
    those am would could also""".split()
)

METHODS = ("memory", "full_history", "window_only", "recent_tokens")

SCORING = 2
"""The scoring rule new runs and experiments are scored with (see the module's docstring)."""
SCORING_RULES = {1: "dates count wherever they are written",
                 2: "a date counts beside a distinctive word of its question"}
DISTINCTIVE = 0.1
"""A question word is distinctive when at most this share of the conversation's messages say it."""

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# A date as notes write one: "8 May 2023", "8th of May, 2023", "May 8, 2023", "Monday, 8 May 2023",
# "2023-05-08", "2023/05/08" (day/month orders written with slashes alone are ambiguous: not read).
_MONTH = r"(?P<{}>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?" \
         r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
_WEEKDAY = r"(?:(?P<weekday>mon|tue(?:s)?|wed(?:nes)?|thu(?:r(?:s)?)?|fri|sat(?:ur)?|sun)(?:day)?\.?,?\s+)?"
_DATE = regex.compile(
    _WEEKDAY + r"(?:(?P<d1>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH.format("m1") + r",?\s+(?P<y1>\d{4})"
    r"|" + _MONTH.format("m2") + r"\s+(?P<d2>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<y2>\d{4})"
    r"|(?P<y3>\d{4})[-/](?P<m3>\d{1,2})[-/](?P<d3>\d{1,2}))(?![\w/-])", regex.IGNORECASE)
_TIME = regex.compile(r"\b\d{1,2}(?:[:.]\d{2})?\s*[ap]\.?m\b\.?|\b\d{1,2}:\d{2}\b", regex.IGNORECASE)
_BULLET = regex.compile(r"\s*(?:[-*•+]|\d+[.)])\s+")
# words a heading may hold beside its date and time ("Date: …", "Session 3 — …", "… at 1:56 pm on …")
_HEADING_WORDS = frozenset({"date", "pm", "p", "m", "on", "at", *_WEEKDAYS, *(d[:3] for d in _WEEKDAYS), "tues", "thur",
                            "thurs"})
_SESSION = regex.compile(r"\b(?:session|day|part)\s+\d+\b", regex.IGNORECASE)
# a line's own date at its start, in brackets or before a separator: "(8 May 2023) …", "8 May 2023: …",
# "[2023-05-08 10:00] …" (the date is read from the match by _DATE: its groups here are unnamed)
_STAMP = (r"(?:date\W*)?" + regex.sub(r"\(\?P<\w+>", "(?:", _DATE.pattern)
          + rf"(?:\s*,?\s*(?:at\s+)?(?:{_TIME.pattern}))?")
_LEADING = regex.compile(rf"\s*(?:[(\[]\s*{_STAMP}\s*[)\]]\s*[:\-–—|]?|{_STAMP}\s*[:\-–—|])\s*", regex.IGNORECASE)


def _date_words(match: regex.Match) -> set[str] | None:
    """A date's words as message dates are written ("8 may 2023", with its weekday when given),
    whatever the notes' spelling ("May 8th, 2023", "2023-05-08"); ``None`` for no real date
    ("2023-13-45")."""
    day, month, year = (next(match[f"{k}{i}"] for i in (1, 2, 3) if match[f"{k}{i}"]) for k in ("d", "m", "y"))
    if not 1 <= int(day) <= 31:
        return None
    if month.isdigit():
        number = int(month)
        if not 1 <= number <= 12:
            return None
        name = _MONTHS[number - 1]
    else:
        name = next(m for m in _MONTHS if m.startswith(month.lower().rstrip(".")[:3]))
    words = {str(int(day)), name, year}
    if match["weekday"]:
        words.add(next(d for d in _WEEKDAYS if d.startswith(match["weekday"].lower()[:3])))
    return words


def content_words(text: str) -> set[str]:
    """The words retention compares: letters and digits of any script, lower-cased, no stop words."""
    folded = unicodedata.normalize("NFKC", text).replace("İ", "I").casefold()  # ("İ" folds to i + a dot mark)
    return {w for w in _WORD.findall(folded) if w not in STOP_WORDS}


def render_for_scoring(message: Message) -> str:
    stamp = f"{message.created_at.day} {message.created_at:%B %Y}"
    return f"[{stamp}] {message.content}" if message.role != "system" else message.content


def render_context(messages: Sequence[Message]) -> str:
    return "\n".join(render_for_scoring(m) for m in messages)


def check_scoring(rule: object) -> int:
    """``rule`` if it is a known scoring rule, else a ``ValueError`` naming the known ones."""
    if isinstance(rule, bool) or not isinstance(rule, int) or rule not in SCORING_RULES:
        known = "; ".join(f"{k}: {v}" for k, v in SCORING_RULES.items())
        raise ValueError(f"unknown scoring rule {rule!r} (known: {known})")
    return rule


def scoring_rule(value: Any) -> int | None:
    """A run's recorded scoring rule as a number (``None``: not scored)."""
    try:
        return None if value is None or value != value else int(value)
    except (TypeError, ValueError):
        return None


def stale_runs(runs: Any, rule: int) -> list[str]:
    """The completed runs (a frame of the runs table) scored under a rule other than ``rule`` that
    ``rescore`` can move to it (not a later rule than this version knows: a newer omem's)."""
    out = []
    for row in runs.itertuples():
        number = scoring_rule(row.scoring)
        if row.status == "completed" and number is not None and number != rule and number <= SCORING:
            out.append(row.run_id)
    return out


def is_earlier(rule: Any) -> bool:
    """Whether figures recorded under ``rule`` were scored under an earlier rule than the current
    one, which ``rescore`` can bring up to date (not a later one: a newer omem's)."""
    number = scoring_rule(rule)
    return number is not None and number < SCORING


def scoring_note(rules: Sequence[Any], names: Sequence[str] = ("A", "B")) -> str | None:
    """Why retention figures side by side are not comparable: runs scored under different rules
    (``rules``: each run's recorded ``scoring``; a run not scored is left out), else ``None``."""
    scored = [(name, rule) for name, rule in zip(names, map(scoring_rule, rules)) if rule is not None]
    if len({rule for _, rule in scored}) < 2:
        return None
    said = ", ".join(f"{name} under rule {rule} ({SCORING_RULES.get(rule, 'unknown')})" for name, rule in scored)
    return (f"the runs' retention was scored under different rules: {said}; their retention figures are not "
            "directly comparable (the rules are in docs/benchmarks.md)")


def earlier_rule_note(rule: Any) -> str | None:
    """What to say of figures scored under a rule other than the current one (``None``: current
    or not scored)."""
    rule = scoring_rule(rule)
    if rule is None or rule == SCORING:
        return None
    if rule > SCORING:
        return (f"retention here was scored under rule {rule}, a later rule than this version of omem knows (rules "
                f"1–{SCORING}): compare it only with figures scored under rule {rule}, and upgrade omem to read "
                "them as that rule means them")
    return (f"retention here was scored under rule {rule} ({SCORING_RULES.get(rule, 'unknown')}), not the current "
            f"rule {SCORING} ({SCORING_RULES[SCORING]}): compare it only with figures scored under rule {rule} "
            "(the rules are in docs/benchmarks.md)")


def _date_heading(line: str) -> set[str] | None:
    """The words of a date when ``line`` is a date heading — a line holding a whole date and
    nothing else but its weekday, a clock time and words like "Date:" or "Session 3" ("8 May
    2023", "## Tuesday, 9 May 2023", "**May 9, 2023**", "- 9 May 2023", "Date: 2023-05-09",
    "1:56 pm on 8 May, 2023") — else ``None``. A weekday or a month alone ("- Monday") is a note."""
    bullet = _BULLET.match(line)
    line = line[bullet.end():] if bullet else line  # ("- 8 May 2023" over indented bullets)
    match = _DATE.search(line)
    if match is None:
        return None
    rest = _SESSION.sub(" ", _TIME.sub(" ", line[:match.start()] + " " + line[match.end():]))
    if not content_words(rest) <= _HEADING_WORDS:
        return None
    return _date_words(match)


def _dated_line(line: str) -> tuple[set[str], set[str]]:
    """A note line's own words and the date it starts with, if any ("- (7 May 2023) Ana: …",
    "- 7 May 2023: …"): a date that stamps a line is its date, as a heading would be; a date
    within the text ("yesterday (7 May 2023)") is text."""
    bullet = _BULLET.match(line)
    body = line[bullet.end():] if bullet else line
    leading = _LEADING.match(body)
    date = _DATE.search(leading[0]) if leading is not None else None
    words = _date_words(date) if date is not None else None
    if leading is None or words is None:
        return content_words(line), set()
    return content_words(body[leading.end():]), words


class Visible:
    """What one method shows the agent, read as lines and their dates, for scoring probes.

    ``messages`` are rendered as :func:`render_for_scoring` does: a message is a line dated by its
    timestamp; a ``system`` message (the memory) and each of ``notes`` is read line by line, a
    line under a date heading dated by it.
    """

    def __init__(self, messages: Sequence[Message] = (), notes: Sequence[str] = ()) -> None:
        self.everything: set[str] = set()  # every word as written, dates included (rule 1)
        self.words: set[str] = set()  # the lines' own words, their dates left out
        self._dates_by_word: dict[str, set[str]] = {}  # a line's word -> the words of that line's date
        for message in messages:
            if message.role == "system":
                self._notes(message.content)
            else:
                self.everything |= content_words(render_for_scoring(message))
                self._line(content_words(message.content),
                           content_words(f"{message.created_at.day} {message.created_at:%B %Y}"))
        for text in notes:
            self._notes(text)

    def _notes(self, text: str) -> None:
        self.everything |= content_words(text)
        date: set[str] = set()
        for line in text.splitlines():
            heading = _date_heading(line)
            if heading is not None:
                date = heading
                continue
            words, own = _dated_line(line)
            self._line(words, own or date)

    def _line(self, words: set[str], date: set[str]) -> None:
        self.words |= words
        if date:
            for word in words:
                self._dates_by_word.setdefault(word, set()).update(date)

    def for_question(self, question_words: set[str] | None) -> set[str]:
        """The words that count for a question: every word as written under rule 1 (``None``);
        under rule 2 the lines' words and the dates of the lines sharing ``question_words``."""
        if question_words is None:
            return self.everything
        found = set(self.words)
        for word in question_words:
            found |= self._dates_by_word.get(word, set())
        return found


class Scorer:
    """Scores the probes of one conversation under one rule (see the module's docstring)."""

    def __init__(self, conversation: Any, rule: int = SCORING) -> None:
        self.rule = check_scoring(rule)
        turns = [t for t in conversation.turns if t.role != "system"]
        said: dict[str, int] = {}
        for turn in turns:
            for word in content_words(turn.content):
                said[word] = said.get(word, 0) + 1
        self._said = said
        self._limit = max(1.0, DISTINCTIVE * len(turns))  # (a word said once is distinctive)

    def question_words(self, question: str | None) -> set[str] | None:
        """The words of ``question`` a date must share a line with to count (``None``: any date
        counts, rule 1)."""
        if self.rule == 1:
            return None
        return {w for w in content_words(question or "") if self._said.get(w, 0) <= self._limit}

    def score(self, probe: Any, visible: Visible) -> float | None:
        """``probe``'s score against ``visible`` (``None``: unscorable, no gold words)."""
        return probe_score(probe.gold, visible.for_question(self.question_words(probe.question)))


def probe_score(gold: str | None, visible: set[str]) -> float | None:
    """Share of the gold answer's content words in ``visible``; ``None`` when unscorable."""
    if gold is None:
        return None
    words = content_words(gold)
    if not words:
        return None
    return len(words & visible) / len(words)


def newest_tokens(history: Sequence[Message], budget: int, count: Callable[[list[str]], list[int]]) -> list[Message]:
    """The newest messages of ``history`` whose volume fits ``budget`` (the recency baseline)."""
    counts = count([m.content for m in history]) if history else []
    kept: list[Message] = []
    used = 0
    for message, tokens in zip(reversed(history), reversed(counts)):
        if used + tokens > budget:
            break
        kept.append(message)
        used += tokens
    return kept[::-1]


@dataclass(frozen=True)
class RetentionSummary:
    retention: float | None
    full_history: float | None
    window_only: float | None
    recent_tokens: float | None
    scored: int
    per_category: dict[str, dict[str, float | int | None]]
    in_window: int = 0  # probes not scored: their evidence is all still in the final window

    @property
    def relative(self) -> float | None:
        if self.retention is None or not self.full_history:
            return None
        return self.retention / self.full_history


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(rows: Sequence[dict]) -> RetentionSummary:
    """Mean scores per method, overall and per category, over probes every method scored."""
    by_probe: dict[str, dict[str, float]] = {}
    category: dict[str, str] = {}
    for row in rows:
        if row["method"] in METHODS and row["score"] is not None:
            by_probe.setdefault(row["probe_id"], {})[row["method"]] = row["score"]
            category[row["probe_id"]] = row["category"]
    complete = {p: s for p, s in by_probe.items() if all(m in s for m in METHODS)}

    def means(probes: dict[str, dict[str, float]]) -> dict[str, float | None]:
        return {m: _mean([s[m] for s in probes.values()]) for m in METHODS}

    overall = means(complete)
    per_category = {
        cat: {**means({p: s for p, s in complete.items() if category[p] == cat}),
              "probes": sum(1 for p in complete if category[p] == cat)}  # a count (JSON: 32, not 32.0)
        for cat in sorted({category[p] for p in complete})
    }
    waiting = {row["probe_id"] for row in rows if row["method"] in METHODS and row.get("evidence_in_window")}
    return RetentionSummary(overall["memory"], overall["full_history"], overall["window_only"],
                            overall["recent_tokens"], len(complete), per_category, len(waiting))


def evidence_in_window(probe: Any, window_ids: set[str]) -> bool:
    """Whether every evidence message of ``probe`` is still in the window (so nothing of it has
    had to survive yet: not scored). A probe without evidence is scored."""
    return bool(probe.evidence) and all(e in window_ids for e in probe.evidence)


def score_retention(conversation: Any, context: Sequence[Message], window: Sequence[Message], budget: int,
                    count: Callable[[list[str]], list[int]],
                    recorder: Any = None, rule: int = SCORING) -> RetentionSummary:
    """Score every probe of ``conversation`` against the final context and the three baselines
    (full history, window only, the newest ``budget`` tokens) under scoring rule ``rule``;
    ``recorder`` keeps the rows."""
    scorer = Scorer(conversation, rule)
    history = [t.to_message(conversation.id) for t in conversation.turns]
    visible = {
        "memory": Visible(context),
        "full_history": Visible(history),
        "window_only": Visible(window),
        "recent_tokens": Visible(newest_tokens(history, budget, count)),
    }
    window_ids = {m.id for m in window}
    rows = []
    for probe in conversation.probes:
        waiting = evidence_in_window(probe, window_ids)
        for method in METHODS:
            rows.append({
                "probe_id": probe.id, "method": method, "question": probe.question, "gold": probe.gold,
                "category": probe.category, "evidence": list(probe.evidence), "evidence_in_window": waiting,
                "score": None if waiting else scorer.score(probe, visible[method]), "answer": None,
            })
    if recorder is not None:
        recorder.save_probes([{**r, "evidence": json.dumps(r["evidence"])} for r in rows], METHODS)
    return summarise(rows)
