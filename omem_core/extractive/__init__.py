"""The offline, deterministic compaction baseline, reachable as ``model="omem/extractive"``."""

from .algorithm import observe, reflect, respond
from .provider import ExtractiveLLM, register

__all__ = ["ExtractiveLLM", "observe", "reflect", "register", "respond"]
