"""``omem/extractive`` as a litellm custom provider.

Importing :mod:`omem_core` appends ``{"provider": "omem", ...}`` to
``litellm.custom_provider_map`` (appending: a user's own entries stay) and registers the model's
price (zero) so litellm reports ``cost_usd = 0.0`` for it.
"""

from __future__ import annotations

from typing import Any

import litellm
from litellm import CustomLLM, ModelResponse

from .algorithm import estimate_tokens, respond

PROVIDER = "omem"
MODELS = ("extractive",)


class OfflineModelError(ValueError):
    pass


def _user_text(messages: list[dict[str, Any]]) -> tuple[str, int]:
    texts = [m.get("content") or "" for m in messages]
    prompt_tokens = sum(estimate_tokens(t) for t in texts if isinstance(t, str))
    user = [m.get("content") for m in messages if m.get("role") == "user"]
    last = user[-1] if user else (texts[-1] if texts else "")
    return (last if isinstance(last, str) else ""), prompt_tokens


class ExtractiveLLM(CustomLLM):
    """The offline baseline model (see :mod:`omem_core.extractive.algorithm`)."""

    def _answer(self, model: str, messages: list[dict[str, Any]], model_response: ModelResponse) -> ModelResponse:
        name = model.split("/", 1)[-1]
        if name not in MODELS:
            raise OfflineModelError(
                f"unknown offline model {model!r}; available: "
                + ", ".join(f"{PROVIDER}/{m}" for m in MODELS)
            )
        text, prompt_tokens = _user_text(messages)
        output = respond(text)
        model_response.choices[0].message.content = output  # type: ignore[union-attr]
        model_response.model = f"{PROVIDER}/{name}"
        completion_tokens = estimate_tokens(output)
        model_response.usage = litellm.Usage(  # type: ignore[attr-defined]
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        return model_response

    def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        return self._answer(model, messages, kwargs.get("model_response") or ModelResponse())

    async def acompletion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        return self._answer(model, messages, kwargs.get("model_response") or ModelResponse())


def register() -> None:
    """Make ``omem/extractive`` routable through litellm (idempotent)."""
    if not any(item.get("provider") == PROVIDER for item in litellm.custom_provider_map):
        litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": ExtractiveLLM()})
    litellm.utils.custom_llm_setup()
    for name in MODELS:
        key = f"{PROVIDER}/{name}"
        if key not in litellm.model_cost:
            litellm.register_model(
                {
                    key: {
                        "input_cost_per_token": 0.0,
                        "output_cost_per_token": 0.0,
                        "cache_creation_input_token_cost": 0.0,
                        "cache_read_input_token_cost": 0.0,
                        "litellm_provider": PROVIDER,
                        "mode": "chat",
                        "max_tokens": 1_000_000,
                        "max_input_tokens": 1_000_000,
                        "max_output_tokens": 1_000_000,
                    }
                }
            )
