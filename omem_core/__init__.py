"""omem_core: observational memory for LLM agents.

Keeps the last N messages verbatim, condenses older ones into observation notes with an observer
model and merges accumulated notes into a reflection with a reflector model, inline, inside the
memory read that needs it. Every model call goes through ``litellm.acompletion``; importing this
package also makes the offline baseline model ``"omem/extractive"`` routable.
"""

from __future__ import annotations

from ._env import prepare_environment as _prepare_environment

_prepare_environment()

import litellm as _litellm  # noqa: E402

from .errors import CompactionError  # noqa: E402
from .extractive import register as _register_offline_model  # noqa: E402
from .memory import InMemoryMemoryStore, Memory, MemoryStore  # noqa: E402
from .messages import Message, ObservationRecord  # noqa: E402
from .observations import (  # noqa: E402
    InMemoryObservationStore,
    ObservationStore,
    create_in_memory_observation_store,
)
from .prompts import OBSERVER_PROMPT, REFLECTOR_PROMPT, Prompt  # noqa: E402
from .tokens import count_tokens, heuristic_count, token_counter  # noqa: E402
from .wrapper import (  # noqa: E402
    CompactionEvent,
    ObservationalMemoryStore,
    ThreadState,
    create_observational_memory_store,
)

_litellm.suppress_debug_info = True
_register_offline_model()

OFFLINE_MODEL = "omem/extractive"

__all__ = [
    "OBSERVER_PROMPT",
    "OFFLINE_MODEL",
    "REFLECTOR_PROMPT",
    "CompactionError",
    "CompactionEvent",
    "InMemoryMemoryStore",
    "InMemoryObservationStore",
    "Memory",
    "MemoryStore",
    "Message",
    "ObservationRecord",
    "ObservationStore",
    "ObservationalMemoryStore",
    "Prompt",
    "ThreadState",
    "count_tokens",
    "create_in_memory_observation_store",
    "create_observational_memory_store",
    "heuristic_count",
    "token_counter",
]
