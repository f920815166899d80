"""kvbm: a KV-cache block manager for LLM serving, in Rust.

The extension module ``kvbm.kvbm`` holds every class and function; this
package re-exports them. ``kvbm.vllm`` adapts ``VllmBlockPool`` to vLLM's
``BlockPool`` when vLLM is installed (kvbm itself needs no other package).
"""

from .kvbm import *  # noqa: F403
from . import kvbm as _extension

__doc__ = _extension.__doc__
__all__ = _extension.__all__
