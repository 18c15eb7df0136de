"""Token volume estimators.

The wrapper's default volume is ``ceil(len(text) / 4)``. ``count_tokens`` is the tiktoken-based
helper; it works offline because :mod:`omem_core` points ``TIKTOKEN_CACHE_DIR`` at the encodings
that litellm bundles (``o200k_base`` and ``cl100k_base``) before tiktoken is first used.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ._env import prepare_environment

TokenCounter = Callable[[list[str]], list[int]]

ENCODINGS = ("o200k_base", "cl100k_base")


def heuristic_count(texts: Sequence[str]) -> list[int]:
    """``ceil(len(text) / 4)`` per text: the spec's default volume estimate."""
    return [-(-len(text) // 4) for text in texts]


@functools.cache
def _encoding(name: str):  # type: ignore[no-untyped-def]
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
    prepare_environment()
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:  # network fetch failed: say where we looked
        raise RuntimeError(
            f"tiktoken could not load {name!r} offline (TIKTOKEN_CACHE_DIR is "
            f"{__import__('os').environ.get('TIKTOKEN_CACHE_DIR')!r}); is litellm installed?"
        ) from exc


def count_tokens(texts: Sequence[str], *, encoding: str = "o200k_base") -> list[int]:
    """Exact token counts with tiktoken, one per text, in order (special tokens count as text)."""
    if not texts:
        return []
    return [len(ids) for ids in _encoding(encoding).encode_ordinary_batch(list(texts))]


def token_counter(encoding: str = "o200k_base") -> TokenCounter:
    """A ``count_tokens`` callable bound to one encoding, for ``create_observational_memory_store``.

    ``"heuristic"`` gives the ``ceil(len/4)`` estimate.
    """
    if encoding == "heuristic":
        return heuristic_count
    _encoding(encoding)  # fail now, not inside a read
    return functools.partial(count_tokens, encoding=encoding)
