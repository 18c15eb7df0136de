"""Process set-up that must happen before litellm or tiktoken are imported.

* litellm fetches its model price map from the network at import time unless told to use the
  copy it ships; we default to the local copy (a user can still override the variable).
* tiktoken downloads encodings on first use; litellm bundles ``cl100k_base`` and ``o200k_base``,
  so we point ``TIKTOKEN_CACHE_DIR`` at that folder unless the user chose another one.
"""

from __future__ import annotations

import importlib.util
import os
import re

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$|API_KEY|ACCESS_KEY|SECRET",
                          re.IGNORECASE)
_SECRET_MIN = 12  # characters: shorter values are ordinary words too often ("postgres")


def litellm_tokenizer_dir() -> str | None:
    """The folder in which litellm ships tiktoken's encodings, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or spec.origin is None:
        return None
    return os.path.join(os.path.dirname(spec.origin), "litellm_core_utils", "tokenizers")


def prepare_environment() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    folder = litellm_tokenizer_dir()
    if folder is not None and os.path.isdir(folder):
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", folder)


def environment_secrets() -> list[tuple[str, str]]:
    """``(value, name)`` of every secret-looking environment variable, longest value first (read
    now: a key set after import counts)."""
    return sorted(((value, name) for name, value in os.environ.items()
                   if len(value) >= _SECRET_MIN and _SECRET_NAME.search(name)), key=lambda p: -len(p[0]))


def call_secrets(kwargs: object) -> list[tuple[str, str]]:
    """``(value, name)`` of every secret-looking string among a model call's keyword arguments
    (``api_key``, ``extra_headers={"x-api-key": ...}`` or ``{"Authorization": "Bearer ..."}``,
    nested dicts, and lists of ``(name, value)`` pairs), plus every secret-looking environment
    variable's, longest value first: a per-tenant key passed in ``completion_kwargs`` was quoted
    by a provider's error into every error, event and trace. A name is judged by its own last
    part, ``-`` read as ``_`` (``x-api-key``, ``X-Auth-Token``)."""
    found: list[tuple[str, str]] = []

    def secret_name(key: str) -> bool:
        key = key.replace("-", "_")
        return bool(_SECRET_NAME.search(key)) or "authorization" in key.lower()

    def walk(value: object, name: str, key: str) -> None:
        if isinstance(value, dict):
            for inner, item in value.items():
                walk(item, f"{name}[{inner!r}]" if name else str(inner), str(inner))
        elif isinstance(value, (list, tuple)):
            if len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], str):
                walk(value[1], f"{name}[{value[0]!r}]", value[0])  # (a header as a (name, value) pair)
            else:
                for item in value:
                    walk(item, name, key)
        elif isinstance(value, str) and secret_name(key):
            token = value[7:].strip() if value.lower().startswith("bearer ") else value
            if len(token) >= _SECRET_MIN:  # ("Bearer EMPTY" for a local server: an ordinary word)
                found.append((value, name))
                if token != value:  # (the key alone is quoted too)
                    found.append((token, name))

    walk(kwargs, "", "")
    return sorted([*found, *environment_secrets()], key=lambda p: -len(p[0]))


def redact_secrets(text: str, secrets: list[tuple[str, str]] | None = None) -> str:
    """``text`` with the value of every secret-looking environment variable (``*_API_KEY``,
    ``*_KEY``, ``*_TOKEN``, ``*SECRET*``, ``*_PASSWORD``, ``*_CREDENTIALS``; 12 characters or
    more) replaced by its name in brackets: a provider's error that quotes the key sent never
    carries it into a log, a stored error or the screen. Longer values first, so a value that
    starts with another is replaced whole. ``secrets``: :func:`environment_secrets`, read once
    by a caller redacting many strings."""
    if not text:
        return text
    for value, name in environment_secrets() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, f"[{name}]")
    return text


_LITELLM_NOISE = ("\nTraceback (most recent call last):", "\n\nThis looks like a bug in LiteLLM")


def error_text(exc: BaseException) -> str:
    """A model call's error as one readable reason, ``Type: message``, cleaned of secrets: litellm
    appends the provider's whole traceback and a prefilled bug-report link to the message of an
    error raised inside a provider (a custom one, a local server's client), which is not a reason
    a person reads in a table, a banner or a stored error."""
    text = str(exc)
    for marker in _LITELLM_NOISE:
        text = text.split(marker, 1)[0]
    return redact_secrets(f"{type(exc).__name__}: {text.strip()}")
