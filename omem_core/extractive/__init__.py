"""The offline, deterministic compaction baseline, reachable as ``model="omem/extractive"``,
and the deterministic trim the wrapper falls back on (:func:`trim`)."""

from .algorithm import observe, reflect, respond, trim
from .provider import ExtractiveLLM, register

__all__ = ["ExtractiveLLM", "observe", "reflect", "register", "respond", "trim"]
