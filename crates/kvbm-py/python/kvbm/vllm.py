"""kvbm's block pool in place of vLLM 0.33's ``BlockPool``.

``KvbmBlockPool`` subclasses ``vllm.v1.core.block_pool.BlockPool`` and keeps
its state (the free queue, the prefix-cache map) in ``kvbm.VllmBlockPool``,
in Rust. It hands out vLLM's own ``KVCacheBlock`` objects, so vLLM's
managers and scheduler work unchanged, and its eviction order is vLLM's
free queue, exactly. Each loop over blocks is one call into Rust: an
allocation with its evictions, a step's frees, the caching of a request's
full blocks and, once ``install()`` patched them, the per-block lookup of
``FullAttentionManager.find_longest_cache_hit`` and the per-block loop of
``KVCacheManager.estimate_cached_tokens``.

::

    import kvbm.vllm

    kvbm.vllm.install()      # every BlockPool vLLM builds from now on
    ...                      # build vLLM's Scheduler / KVCacheManager as usual
    kvbm.vllm.uninstall()

kvbm does not need vLLM: without it, importing this module works,
``AVAILABLE`` is False and ``install()`` raises ``ImportError``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from . import PoolError, PoolExhaustedError, VllmBlockPool

try:
    from vllm.distributed.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved
    from vllm.v1.core import block_pool as _block_pool_module
    from vllm.v1.core import kv_cache_coordinator as _coordinator_module
    from vllm.v1.core import single_type_kv_cache_manager as _managers_module
    from vllm.v1.core.block_pool import BlockPool as _VllmBlockPool
    from vllm.v1.core.kv_cache_utils import (
        KVCacheBlock,
        BlockHashListWithBlockSize,
        get_block_hash,
        get_group_id,
        maybe_convert_block_hash,
        resolve_block_hashes,
    )
    from vllm.v1.core.kv_cache_manager import KVCacheManager as _KVCacheManager
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CrossAttentionSpec,
        EncoderOnlyAttentionSpec,
        FullAttentionSpec,
    )
except ImportError as _error:  # vLLM is not installed: nothing to adapt.
    AVAILABLE = False
    _IMPORT_ERROR: ImportError | None = _error
else:
    AVAILABLE = True
    _IMPORT_ERROR = None

__all__ = ["AVAILABLE", "install", "uninstall", "installed"]

logger = logging.getLogger(__name__)


def _require() -> None:
    if not AVAILABLE:
        raise ImportError(
            "kvbm.vllm needs vLLM 0.33 (import vllm failed: "
            f"{_IMPORT_ERROR})"
        )


if AVAILABLE:
    __all__ += ["KvbmBlockPool", "FreeQueueView", "CacheMapView", "ExtraKeysView"]

    class FreeQueueView:
        """vLLM's ``FreeKVCacheBlockQueue``, read only: the pool's free
        queue, front (next handed out) first."""

        __slots__ = ("_core",)

        def __init__(self, core: VllmBlockPool) -> None:
            self._core = core

        @property
        def num_free_blocks(self) -> int:
            """Blocks in the queue."""
            return self._core.num_free_blocks

        def get_all_free_blocks(self) -> list[KVCacheBlock]:
            """The queue's blocks, front first."""
            return self._core.free_block_list()

        def iter_blocks_after(self, cursor: KVCacheBlock | None):
            """The queue's blocks after ``cursor`` (from the front if None)."""
            blocks = self._core.free_block_list()
            if cursor is None:
                return iter(blocks)
            for i, block in enumerate(blocks):
                if block is cursor:
                    return iter(blocks[i + 1 :])
            return iter(())

    class CacheMapView:
        """vLLM's ``BlockHashToBlockMap``, read only: key (hash bytes plus
        4-byte group id) to the blocks cached under it."""

        __slots__ = ("_core",)

        def __init__(self, core: VllmBlockPool) -> None:
            self._core = core

        def get_one_block(self, key: bytes) -> KVCacheBlock | None:
            """The earliest block cached under ``key``."""
            return self._core.get_one_block(key)

        def contain(self, key: bytes, block_id: int) -> bool:
            """Whether ``key`` maps to block ``block_id``."""
            return self._core.contains(key, block_id)

        def __contains__(self, key: bytes) -> bool:
            return self._core.get_one_block(key) is not None

        def __len__(self) -> int:
            return self._core.num_cached_keys

        @property
        def _cache(self) -> Mapping[bytes, Any]:
            """A read-only snapshot of the map in vLLM's shape: key to one
            block, or to ``{block_id: block}`` for several."""
            view: dict[bytes, Any] = {}
            for key in self._core.cached_keys():
                ids = self._core.cached_ids(key)
                blocks = [self._core.block(i) for i in ids]
                view[key] = (
                    blocks[0] if len(blocks) == 1 else {b.block_id: b for b in blocks}
                )
            return MappingProxyType(view)

    class ExtraKeysView:
        """vLLM's ``cached_block_hashes_by_block``, read only: block id to
        the keys it holds beyond its primary one."""

        __slots__ = ("_core",)

        def __init__(self, core: VllmBlockPool) -> None:
            self._core = core

        def __contains__(self, block_id: object) -> bool:
            return isinstance(block_id, int) and bool(
                block_id >= 0 and self._core.extra_keys(block_id)
            )

        def __getitem__(self, block_id: int) -> set[bytes]:
            keys = self._core.extra_keys(block_id) if block_id >= 0 else []
            if not keys:
                raise KeyError(block_id)
            return set(keys)

        def get(self, block_id: int, default: Any = None) -> Any:
            return self[block_id] if block_id in self else default

        def __iter__(self):
            return iter(self._core.blocks_with_extra_keys())

        def __len__(self) -> int:
            return len(self._core.blocks_with_extra_keys())

        def keys(self):
            return self._core.blocks_with_extra_keys()

        def items(self):
            return [(i, self[i]) for i in self._core.blocks_with_extra_keys()]

    class KvbmBlockPool(_VllmBlockPool):
        """vLLM's ``BlockPool`` with its state in Rust (``kvbm.VllmBlockPool``).

        Same constructor, same methods, same results: the blocks are
        vLLM's ``KVCacheBlock`` objects, handed out in vLLM's free-queue
        order. ``free_block_queue``, ``cached_block_hash_to_block`` and
        ``cached_block_hashes_by_block`` are read-only views of the Rust
        state. A block freed more often than referenced raises
        ``kvbm.PoolError`` (vLLM's pool would corrupt its queue).
        """

        def __init__(
            self,
            num_gpu_blocks: int,
            enable_caching: bool,
            hash_block_size: int,
            enable_kv_cache_events: bool = False,
            metrics_collector: Any = None,
            num_hash_lookahead_tokens: int = 0,
            medium: str = MEDIUM_GPU,
        ) -> None:
            # Not the parent's __init__: it builds the Python queue and map.
            assert isinstance(num_gpu_blocks, int) and num_gpu_blocks > 0
            self.num_gpu_blocks = num_gpu_blocks
            self.medium = medium
            self.enable_caching = enable_caching
            self.hash_block_size = hash_block_size
            self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
            self.blocks = [KVCacheBlock(i, pool=self) for i in range(num_gpu_blocks)]
            self._kvbm_core = VllmBlockPool(
                self.blocks,
                enable_caching=enable_caching,
                events=enable_kv_cache_events,
            )
            self.null_block = self._kvbm_core.null_block
            self.free_block_queue = FreeQueueView(self._kvbm_core)
            self.cached_block_hash_to_block = CacheMapView(self._kvbm_core)
            self.cached_block_hashes_by_block = ExtraKeysView(self._kvbm_core)
            self.enable_kv_cache_events = enable_kv_cache_events
            self.kv_event_queue = []
            self.metrics_collector = metrics_collector
            self._reuse_watchers = {}

        def _sync_events(self) -> None:
            """Moves the Rust side's removals and resets into the event
            queue, as vLLM's events (stored ones are built here, with the
            request's tokens)."""
            for kind, key in self._kvbm_core.take_events():
                if kind == "removed":
                    self.kv_event_queue.append(
                        BlockRemoved(
                            block_hashes=[
                                maybe_convert_block_hash(get_block_hash(key))
                            ],
                            medium=self.medium,
                            group_idx=get_group_id(key),
                        )
                    )
                elif kind == "cleared":
                    self.kv_event_queue.append(AllBlocksCleared())

        def get_cached_block(self, block_hash, kv_cache_group_ids):
            return self._kvbm_core.get_cached_block(block_hash, kv_cache_group_ids)

        def cache_full_blocks(
            self,
            request,
            blocks,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            block_mask=None,
        ) -> None:
            if num_cached_blocks >= num_full_blocks:
                return
            hashes = request.block_hashes
            stride = 1
            if block_size != self.hash_block_size:
                if isinstance(hashes, BlockHashListWithBlockSize):
                    hashes, stride = hashes.block_hashes, hashes.scale_factor
                else:
                    assert block_size % self.hash_block_size == 0
                    stride = block_size // self.hash_block_size
            keys = self._kvbm_core.cache_full_blocks(
                blocks,
                hashes,
                num_cached_blocks,
                num_full_blocks,
                block_size,
                kv_cache_group_id,
                stride=stride,
                block_mask=block_mask,
            )
            if self.enable_kv_cache_events:
                self._sync_events()
                self._stored_event(
                    request,
                    blocks,
                    keys,
                    num_cached_blocks,
                    num_full_blocks,
                    block_size,
                    kv_cache_group_id,
                    block_mask,
                )

        def _stored_event(
            self,
            request,
            blocks,
            keys,
            num_cached_blocks,
            num_full_blocks,
            block_size,
            kv_cache_group_id,
            block_mask,
        ) -> None:
            """vLLM's ``BlockStored`` event for the blocks just cached."""
            block_hashes = resolve_block_hashes(
                request.block_hashes, self.hash_block_size, block_size
            )
            parent = (
                None
                if num_cached_blocks == 0
                else maybe_convert_block_hash(block_hashes[num_cached_blocks - 1])
            )
            extra_keys_list = []
            lookahead = [] if self.num_hash_lookahead_tokens else None
            mm_index = 0
            for i in range(num_cached_blocks, num_full_blocks):
                if blocks[i].is_null:
                    continue
                if block_mask is not None and not block_mask[i - num_cached_blocks]:
                    continue
                start = i * block_size
                end = start + block_size
                extra_keys, mm_index = self._generate_event_extra_keys(
                    request, start, end, mm_index
                )
                extra_keys_list.append(extra_keys)
                if lookahead is not None:
                    lookahead.append(self._lookahead_token_ids(request, end))
            self.kv_event_queue.append(
                self._build_block_stored_event(
                    request,
                    block_hashes=[
                        maybe_convert_block_hash(get_block_hash(k)) for k in keys
                    ],
                    parent_block_hash=parent,
                    start_token_idx=num_cached_blocks * block_size,
                    end_token_idx=num_full_blocks * block_size,
                    block_size=block_size,
                    kv_cache_group_id=kv_cache_group_id,
                    extra_keys_list=extra_keys_list,
                    lookahead_token_ids=lookahead,
                )
            )

        def _remove_cached_block_hashes(self, block):
            return self._kvbm_core.remove_hashes(block)

        def _insert_block_hash(self, block_hash_with_group_id, block, num_tokens):
            self._kvbm_core.insert_hash(block_hash_with_group_id, block, num_tokens)

        def get_new_blocks(self, num_blocks: int):
            try:
                blocks = self._kvbm_core.get_new_blocks(num_blocks)
            except PoolExhaustedError:
                raise ValueError(
                    f"Cannot get {num_blocks} free blocks from the pool"
                ) from None
            if self._reuse_watchers:
                self._notify_reuse(blocks)
            if self.enable_kv_cache_events:
                self._sync_events()
            if self.metrics_collector:
                for block in blocks:
                    if self.enable_caching:
                        self.metrics_collector.on_block_evicted(block)
                    self.metrics_collector.on_block_allocated(block)
            return blocks

        def unpin_blocks(self, blocks, on_reuse) -> None:
            blocks = list(blocks)
            for block in blocks:
                self._reuse_watchers[block.block_id] = on_reuse
            self._kvbm_core.unpin(blocks)

        def _maybe_evict_cached_block(self, block) -> bool:
            if self.metrics_collector:
                self.metrics_collector.on_block_evicted(block)
            removed = self._kvbm_core.remove_hashes(block)
            if not removed:
                return False
            self._emit_block_removed_events(removed)
            return True

        def touch(self, blocks) -> None:
            if self.metrics_collector:
                blocks = list(blocks)
                self._kvbm_core.touch(blocks)
                for block in blocks:
                    if not block.is_null:
                        self.metrics_collector.on_block_accessed(block)
                return
            self._kvbm_core.touch(blocks)

        def free_blocks(self, ordered_blocks) -> None:
            foreign = self._kvbm_core.free_blocks(ordered_blocks)
            if foreign:
                by_pool: dict[Any, list] = {}
                for block in foreign:
                    pool = block.pool
                    if pool is None or pool is self:
                        raise PoolError(f"{block!r} is not a block of this pool")
                    by_pool.setdefault(pool, []).append(block)
                for pool, blocks in by_pool.items():
                    pool.free_blocks(blocks)

        def evict_blocks(self, block_ids) -> None:
            block_ids = list(block_ids)
            for block_id in block_ids:
                assert 0 <= block_id < len(self.blocks), (
                    f"Invalid block_id {block_id} >= {len(self.blocks)}. "
                    "This indicates a bug in the KV connector - workers should "
                    "only report block IDs that were allocated by the scheduler."
                )
            if self.metrics_collector:
                for block_id in block_ids:
                    self.metrics_collector.on_block_evicted(self.blocks[block_id])
            self._kvbm_core.evict_blocks(block_ids)
            if self.enable_kv_cache_events:
                self._sync_events()

        def reset_prefix_cache(self) -> bool:
            if not self._kvbm_core.reset_prefix_cache():
                logger.warning(
                    "Failed to reset prefix cache because some "
                    "blocks (%d) are not freed yet",
                    self.num_gpu_blocks - self.get_num_free_blocks() - 1,
                )
                return False
            if self._reuse_watchers:
                self._notify_reuse(
                    [self.blocks[block_id] for block_id in list(self._reuse_watchers)]
                )
            if self.metrics_collector:
                self.metrics_collector.reset()
            if self.enable_kv_cache_events:
                self._sync_events()
            return True

        def get_num_free_blocks(self) -> int:
            return self._kvbm_core.num_free_blocks

        def get_usage(self) -> float:
            return self._kvbm_core.usage

    _FULL_SPECS = (FullAttentionSpec, ChunkedLocalAttentionSpec)
    _ORIGINAL_FIND = _managers_module.FullAttentionManager.__dict__[
        "find_longest_cache_hit"
    ].__func__

    def _find_longest_cache_hit(
        cls,
        block_hashes,
        max_length,
        kv_cache_group_ids,
        block_pool,
        kv_cache_spec,
        drop_eagle_block,
        alignment_tokens,
        dcp_world_size=1,
        pcp_world_size=1,
    ):
        """``FullAttentionManager.find_longest_cache_hit`` with its
        per-block loop in one call when the pool is kvbm's (fine-grained
        lookups, below a block, stay vLLM's)."""
        core = getattr(block_pool, "_kvbm_core", None)
        block_size = kv_cache_spec.block_size
        if dcp_world_size > 1:
            block_size *= dcp_world_size
        if core is None or alignment_tokens < block_size:
            return _ORIGINAL_FIND(
                cls,
                block_hashes,
                max_length,
                kv_cache_group_ids,
                block_pool,
                kv_cache_spec,
                drop_eagle_block,
                alignment_tokens,
                dcp_world_size,
                pcp_world_size,
            )
        assert isinstance(kv_cache_spec, _FULL_SPECS), (
            "FullAttentionManager can only be used for full attention "
            "and chunked local attention groups"
        )
        stride = 1
        if block_size != block_pool.hash_block_size:
            if isinstance(block_hashes, BlockHashListWithBlockSize):
                block_hashes, stride = block_hashes.block_hashes, block_hashes.scale_factor
            else:
                assert block_size % block_pool.hash_block_size == 0
                stride = block_size // block_pool.hash_block_size
        computed = core.find_longest_cache_hit(
            block_hashes, kv_cache_group_ids, max_length // block_size, stride
        )
        found = len(computed[0])
        hit_length = found * block_size
        if drop_eagle_block and hit_length > 0:
            hit_length -= min(alignment_tokens, block_size)
        hit_length -= hit_length % alignment_tokens
        num_blocks = -(-hit_length // block_size)
        if num_blocks < found:
            for blocks in computed:
                del blocks[num_blocks:]
        return computed, hit_length


    _ORIGINAL_ESTIMATE = _KVCacheManager.__dict__["estimate_cached_tokens"]
    _UNCACHED_SPECS = (CrossAttentionSpec, EncoderOnlyAttentionSpec)

    def _estimate_cached_tokens(self, request) -> int:
        """``KVCacheManager.estimate_cached_tokens`` with its per-block loop
        in one call per group when the pool is kvbm's."""
        core = getattr(self.block_pool, "_kvbm_core", None)
        if core is None:
            return _ORIGINAL_ESTIMATE(self, request)
        cached_tokens = None
        for group, blocks in zip(
            self.kv_cache_config.kv_cache_groups,
            self.get_blocks(request.request_id).blocks,
        ):
            spec = group.kv_cache_spec
            if not spec.prefix_cacheable or isinstance(spec, _UNCACHED_SPECS):
                continue
            group_cached_tokens = core.max_hash_num_tokens(blocks)
            cached_tokens = (
                group_cached_tokens
                if cached_tokens is None
                else min(cached_tokens, group_cached_tokens)
            )
        return cached_tokens or 0


_SAVED: dict[str, Any] = {}


def install() -> None:
    """Puts ``KvbmBlockPool`` in place of vLLM's ``BlockPool`` (in
    ``vllm.v1.core.block_pool`` and the coordinator that builds pools), the
    one-call lookup in ``FullAttentionManager.find_longest_cache_hit`` and
    the one-call loop of ``KVCacheManager.estimate_cached_tokens``.
    Pools built before keep their class. Idempotent.

    Raises ``ImportError`` without vLLM.
    """
    _require()
    if _SAVED:
        return
    _SAVED["block_pool"] = _block_pool_module.BlockPool
    _SAVED["coordinator"] = _coordinator_module.BlockPool
    _SAVED["find"] = _managers_module.FullAttentionManager.__dict__[
        "find_longest_cache_hit"
    ]
    _block_pool_module.BlockPool = KvbmBlockPool
    _coordinator_module.BlockPool = KvbmBlockPool
    _managers_module.FullAttentionManager.find_longest_cache_hit = classmethod(
        _find_longest_cache_hit
    )
    _SAVED["estimate"] = _KVCacheManager.__dict__["estimate_cached_tokens"]
    _KVCacheManager.estimate_cached_tokens = _estimate_cached_tokens


def uninstall() -> None:
    """Undoes ``install()``; new pools are vLLM's again."""
    if not _SAVED:
        return
    _block_pool_module.BlockPool = _SAVED.pop("block_pool")
    _coordinator_module.BlockPool = _SAVED.pop("coordinator")
    _managers_module.FullAttentionManager.find_longest_cache_hit = _SAVED.pop("find")
    _KVCacheManager.estimate_cached_tokens = _SAVED.pop("estimate")


def installed() -> bool:
    """Whether ``install()`` is in effect."""
    return bool(_SAVED)
