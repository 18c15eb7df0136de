"""Token volume estimators.

The wrapper's default volume is ``ceil(len(text) / 4)``. ``count_tokens`` is the tiktoken-based
helper; it works offline because :mod:`omem_core` points ``TIKTOKEN_CACHE_DIR`` at the encodings
that litellm bundles (``o200k_base`` and ``cl100k_base``) before tiktoken is first used.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Callable, Sequence

from ._env import litellm_tokenizer_dir, prepare_environment

TokenCounter = Callable[[list[str]], list[int]]

ENCODINGS = ("o200k_base", "cl100k_base")


def heuristic_count(texts: Sequence[str]) -> list[int]:
    """``ceil(len(text) / 4)`` per text: the spec's default volume estimate."""
    return [-(-len(text) // 4) for text in texts]


def _cached_name(name: str) -> str:
    """The file name tiktoken caches an encoding under: the SHA-1 of the address it downloads."""
    return hashlib.sha1(f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken".encode()).hexdigest()


@functools.cache
def _encoding(name: str):  # type: ignore[no-untyped-def]
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
    prepare_environment()
    import tiktoken

    chosen, bundled = os.environ.get("TIKTOKEN_CACHE_DIR"), litellm_tokenizer_dir()
    if (chosen and bundled and os.path.abspath(chosen) != os.path.abspath(bundled)
            and not os.path.exists(os.path.join(chosen, _cached_name(name)))
            and os.path.exists(os.path.join(bundled, _cached_name(name)))):
        # A cache folder of the user's own that lacks this encoding: tiktoken would try to download
        # it (and fail offline, after seconds); litellm's bundled copy is read instead, once.
        with _swap_lock:
            os.environ["TIKTOKEN_CACHE_DIR"] = bundled
            try:
                return tiktoken.get_encoding(name)
            finally:
                os.environ["TIKTOKEN_CACHE_DIR"] = chosen
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:  # network fetch failed: say where we looked
        raise RuntimeError(
            f"tiktoken could not load {name!r}: not in TIKTOKEN_CACHE_DIR ({chosen!r}) nor bundled with "
            f"litellm ({bundled!r}), and it could not be downloaded ({type(exc).__name__}); is litellm installed?"
        ) from exc


_swap_lock = threading.Lock()


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
