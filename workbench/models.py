"""Which litellm model strings are usable here: the offline model always, others when keys exist."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

OFFLINE_MODEL = "omem/extractive"  # omem_core.OFFLINE_MODEL, without importing litellm for it
# Each prompt's default version (omem_core.prompts.BUILTIN_PROMPTS lists it first), likewise: the
# CLI's `runs` names a run's prompts when they are not these, in well under a second.
DEFAULT_PROMPT_VERSIONS = {"observer": "v2", "reflector": "v2"}
# Providers whose only "missing key" is a server address with a local default: not a reason to refuse.
_LOCAL_DEFAULTS = {"OLLAMA_API_BASE", "LM_STUDIO_API_BASE", "HOSTED_VLLM_API_BASE"}

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
    """Whether ``model`` can be called from this environment, without calling it: litellm must
    know which provider serves it, and that provider's keys must be in the environment."""
    model = (model or "").strip()
    if not model:
        return ModelStatus(model, False, "no model given")
    import omem_core  # noqa: F401  (registers the offline provider before litellm is asked)
    from omem_core.extractive.provider import MODELS, PROVIDER

    if model.startswith(f"{PROVIDER}/"):
        if model.split("/", 1)[1] in MODELS:
            return ModelStatus(model, True, "built-in offline model, no key needed")
        return ModelStatus(model, False, "unknown offline model; the built-in one is " + OFFLINE_MODEL)
    import litellm

    try:
        model_name, provider, *_ = litellm.get_llm_provider(model)
    except Exception:
        return ModelStatus(model, False, _no_provider(model, litellm))
    if not str(model_name).strip():  # (as the library refuses it: "ollama/" was listed as usable)
        return ModelStatus(model, False, f"names a provider ({provider}) but no model: e.g. '{provider}/<model name>'")
    try:
        checked = litellm.validate_environment(model=model)
    except Exception as exc:
        return ModelStatus(model, False, f"litellm cannot check it: {type(exc).__name__}: {exc}")
    missing = [key for key in checked.get("missing_keys") or [] if key not in _LOCAL_DEFAULTS]
    if missing:
        return ModelStatus(model, False, "missing " + ", ".join(missing) + " in the environment")
    return ModelStatus(model, True, "keys found in the environment")


def _no_provider(model: str, litellm: Any) -> str:
    """Why litellm cannot route ``model``, with the nearest provider name when one is close."""
    import difflib

    if "/" not in model:
        known = [m for m in litellm.model_cost if "/" not in m and m != "sample_spec"]  # (a placeholder entry)
        close = difflib.get_close_matches(model, known, n=1, cutoff=0.85)
        if close:  # a typo of a model litellm knows ("gpt-4o-mni")
            return f"litellm does not know this model; did you mean {close[0]}?"
        return f"litellm does not know which provider serves it (write it as provider/model, e.g. openai/{model})"
    provider, name = model.split("/", 1)
    known = [getattr(p, "value", str(p)) for p in litellm.provider_list]
    close = difflib.get_close_matches(provider, known, n=1, cutoff=0.75)  # (0.6 offered openai for "nope")
    hint = f"; did you mean {close[0]}/{name}?" if close else " (litellm.provider_list names them)"
    return f"litellm has no provider '{provider}'{hint}"


def unusable_models(models: list[str | None]) -> list[ModelStatus]:
    """The statuses of the models in ``models`` (``None`` skipped) that cannot be called here."""
    seen: dict[str, ModelStatus] = {}
    for model in models:
        if model is not None and model not in seen:
            seen[model] = model_status(model)
    return [status for status in seen.values() if not status.usable]


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
