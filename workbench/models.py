"""Which litellm model strings are usable here: the offline model always, others when keys exist."""

from __future__ import annotations

import os
from dataclasses import dataclass

from omem_core import OFFLINE_MODEL

# A few common choices per provider; any litellm model string can also be typed in the app.
SUGGESTED = [
    ("OPENAI_API_KEY", "gpt-4o-mini"),
    ("OPENAI_API_KEY", "gpt-4.1-mini"),
    ("ANTHROPIC_API_KEY", "anthropic/claude-haiku-4-5"),
    ("GEMINI_API_KEY", "gemini/gemini-2.0-flash"),
    ("GROQ_API_KEY", "groq/llama-3.1-8b-instant"),
    ("MISTRAL_API_KEY", "mistral/mistral-small-latest"),
    ("OLLAMA_API_BASE", "ollama/llama3.1"),
]


@dataclass(frozen=True)
class ModelStatus:
    model: str
    usable: bool
    reason: str


def model_status(model: str) -> ModelStatus:
    """Whether ``model`` can be called from this environment (keys present), without calling it."""
    if model.startswith("omem/"):
        return ModelStatus(model, True, "built-in offline model, no key needed")
    import litellm

    try:
        checked = litellm.validate_environment(model=model)
    except Exception as exc:  # unknown provider
        return ModelStatus(model, False, f"litellm cannot route it: {exc}")
    missing = checked.get("missing_keys") or []
    if missing:
        return ModelStatus(model, False, "missing " + ", ".join(missing))
    return ModelStatus(model, True, "keys found in the environment")


def usable_models() -> list[str]:
    """The offline model, models listed in ``$OMEM_MODELS`` (comma-separated), then suggested
    models whose provider key is in the environment."""
    found = [OFFLINE_MODEL]
    for model in os.environ.get("OMEM_MODELS", "").split(","):
        if model.strip() and model.strip() not in found:
            found.append(model.strip())
    for variable, model in SUGGESTED:
        if os.environ.get(variable) and model not in found:
            found.append(model)
    return found
