"""kvbm: a KV-cache block manager for LLM serving, in Rust.

The block pool with its prefix cache and cache events (``BlockPool``),
request sequences with chained block hashes (``Sequence``,
``RequestSequence``), the continuous-batching scheduler (``Scheduler``) and
the simulator's trace replays (``replay_cache``, ``replay_serve``,
``replay_cluster``).

A call into Rust costs about what a Python call costs, and a list about
80 ns per item, so whole loops cross in one call: a request's prefix lookup,
a step's releases, a scheduler step, a whole replay. Hashes may also travel
packed (``bytes``, 16 little-endian bytes per hash) or as a ``Sequence``.

Every class is thread-safe; long calls release the GIL. Every refusal is a
``KvbmError`` subclass carrying the Rust error's message.
"""

import array
from collections.abc import Iterable, Iterator, Mapping, Sequence as _Seq
from os import PathLike
from typing import Any, Literal, Union, final

__version__: str

__all__ = [
    "__version__",
    "KvbmError",
    "InvalidArgumentError",
    "PoolError",
    "PoolExhaustedError",
    "SequenceError",
    "SchedulerError",
    "SimError",
    "BlockPool",
    "Sequence",
    "RequestSequence",
    "Scheduler",
    "StepPlan",
    "StepReport",
    "PrefillWork",
    "DecodeWork",
    "Finished",
    "Trace",
    "VllmBlockPool",
    "block_hashes",
    "replay_cache",
    "replay_serve",
    "replay_cluster",
]

_Tokens = Union[_Seq[int], Iterable[int]]
"""Token ids in ``0 .. 2**32``: a list, any iterable of ints, or a buffer of
4-byte unsigned ints (``array.array('I')``, a ``numpy.uint32`` array)."""

_Hashes = Union["Sequence", "RequestSequence", bytes, Iterable[int]]
"""Chained block hash values in ``0 .. 2**128``: ints, ``bytes`` packing
them as 16 little-endian bytes each, or a sequence object (its hashes)."""

_Eviction = Literal["lru", "multi-level", "lineage"]
_Model = Literal["gpt-oss-120b", "gpt-oss-20b", "gemma-3-27b", "llama-3.1-8b", "llama-4-scout"]
_Priority = Literal["low", "normal", "high", "critical"]
_Reason = Literal["max_tokens", "stop", "aborted", "cancelled", "capacity_exceeded"]

# Errors ----------------------------------------------------------------------

class KvbmError(Exception):
    """Base class of every error kvbm raises."""

class InvalidArgumentError(KvbmError, ValueError):
    """A value kvbm refuses: a negative or zero size, an unknown policy name,
    a token list of the wrong length. Also a ``ValueError``."""

class PoolError(KvbmError):
    """The block pool refused an operation (a block this pool does not hold,
    say)."""

class PoolExhaustedError(PoolError):
    """Not enough free or evictable blocks, now or ever: nothing was
    allocated."""

class SequenceError(KvbmError):
    """A request sequence refused an operation; it is unchanged."""

class SchedulerError(KvbmError):
    """The scheduler refused a call (a duplicate id, a step not applied);
    nothing changed."""

class SimError(KvbmError):
    """A trace could not be loaded or a replay failed."""

# Hashing ---------------------------------------------------------------------


class VllmBlockPool:
    """vLLM 0.33's ``BlockPool`` state in Rust, over block objects Python
    owns: its free queue (in vLLM's eviction order, exactly) and its
    prefix-cache map. ``kvbm.vllm.KvbmBlockPool`` wraps it as a drop-in for
    vLLM's class; it works without vLLM on any objects with the attributes
    of vLLM's ``KVCacheBlock`` (``block_id``, ``ref_cnt``, ``_block_hash``,
    ``_block_hash_num_tokens``, ``is_null``), which it keeps as vLLM's pool
    would.

    A cache key is a block hash (``bytes``) plus the group id as 4
    big-endian bytes, as vLLM packs them. Refusals leave the pool
    unchanged; a call that re-enters the pool, or races another thread on
    it, raises ``RuntimeError``.
    """

    def __new__(
        cls,
        blocks: Iterable[Any],
        *,
        enable_caching: bool = True,
        events: bool = False,
    ) -> VllmBlockPool:
        """A pool over ``blocks`` (block ``i`` has ``block_id == i`` and
        ``ref_cnt == 0``), all free in id order; block 0 becomes the null
        block. ``enable_caching=False`` never keeps a freed block's hash in
        the eviction order. ``events=True`` records cache events.

        Raises ``InvalidArgumentError`` for an empty or misnumbered list.
        """
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (free or cached, evictable)."""
    @property
    def usage(self) -> float:
        """The fraction of blocks in use, the null block not counted."""
    @property
    def null_block(self) -> Any:
        """The null block object."""
    @property
    def enable_caching(self) -> bool:
        """Whether freed blocks keep their hashes in the eviction order."""
    @property
    def num_cached_keys(self) -> int:
        """Keys in the prefix-cache map."""
    def block(self, block_id: int) -> Any:
        """The block object with id ``block_id``."""
    def get_new_blocks(self, num_blocks: int) -> list[Any]:
        """Pops ``num_blocks`` blocks from the front of the free queue,
        evicting cached ones, each with ``ref_cnt = 1``.

        Raises ``PoolExhaustedError`` if fewer are free (nothing changes).
        """
    def touch(self, blocks: Iterable[Any]) -> None:
        """One more reference to each block (the null block skipped); a
        block with none leaves the free queue. All or none."""
    def free_blocks(self, blocks: Iterable[Any]) -> list[Any] | None:
        """Drops one reference to each block, first evicted first; blocks
        left without one join the queue: unhashed at the front, cached at
        the back. Returns the blocks of other pools (``None`` if none).

        Raises ``PoolError`` (nothing changes) for a block freed more often
        than referenced.
        """
    def unpin(self, blocks: Iterable[Any]) -> None:
        """Drops one reference to each block; those left without one join
        the back of the queue, hashed or not. All or none."""
    def get_cached_block(self, block_hash: bytes, group_ids: _Seq[int]) -> list[Any] | None:
        """The earliest block cached under ``block_hash`` for each group, or
        ``None`` if any group misses."""
    def find_longest_cache_hit(
        self,
        block_hashes: _Seq[bytes],
        group_ids: _Seq[int],
        max_blocks: int,
        stride: int = 1,
    ) -> tuple[list[Any], ...]:
        """The longest run of cached blocks from the start, for every group
        (block ``i``'s hash is ``block_hashes[(i + 1) * stride - 1]``), at
        most ``max_blocks``; one list per group. Touches nothing."""
    def max_hash_num_tokens(self, blocks: Iterable[Any]) -> int:
        """The largest ``_block_hash_num_tokens`` among ``blocks`` (0 if none
        has one): vLLM's ``estimate_cached_tokens`` loop over one group, in
        one call. Changes nothing."""
    def cache_full_blocks(
        self,
        blocks: _Seq[Any],
        block_hashes: _Seq[bytes],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        *,
        stride: int = 1,
        block_mask: _Seq[bool] | None = None,
    ) -> list[bytes]:
        """Caches ``blocks[num_cached_blocks:num_full_blocks]`` under their
        hashes (masked-out and null blocks skipped); returns the keys.

        Raises ``InvalidArgumentError`` (nothing changes) if the hashes or
        the mask are too short.
        """
    def insert_hash(self, key: bytes, block: Any, num_tokens: int | None = None) -> bool:
        """Caches ``block`` under ``key``: its primary key if it has none,
        else an extra one. Returns whether the key is new for the block."""
    def remove_hashes(self, block: Any) -> list[bytes]:
        """Drops every key of ``block`` and resets its hash; returns the
        keys that mapped to it (no event recorded)."""
    def evict_block(self, block: Any) -> bool:
        """Evicts ``block`` from the prefix cache, with ``removed`` events;
        whether it had a key."""
    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Evicts these blocks from the prefix cache; free ones keep their
        place in the queue.

        Raises ``InvalidArgumentError`` (nothing changes) for an id out of
        range.
        """
    def contains(self, key: bytes, block_id: int) -> bool:
        """Whether ``key`` maps to block ``block_id``."""
    def get_one_block(self, key: bytes) -> Any | None:
        """The earliest block cached under ``key``."""
    def cached_ids(self, key: bytes) -> list[int]:
        """The ids cached under ``key``, earliest first."""
    def cached_keys(self) -> list[bytes]:
        """Every key of the prefix-cache map."""
    def extra_keys(self, block_id: int) -> list[bytes]:
        """The keys block ``block_id`` holds beyond its primary one."""
    def blocks_with_extra_keys(self) -> list[int]:
        """The ids of the blocks holding extra keys."""
    def reset_prefix_cache(self) -> bool:
        """Drops every hash if no block but the null block is referenced;
        whether it did. The queue keeps its order."""
    def free_block_ids(self) -> list[int]:
        """The free queue's ids, front (next handed out) first."""
    def free_block_list(self) -> list[Any]:
        """The free queue's block objects, front first."""
    def is_free(self, block_id: int) -> bool:
        """Whether block ``block_id`` is in the free queue."""
    def take_events(self) -> list[tuple[str, Any]]:
        """The events since the last call, oldest first:
        ``("stored", [key, ...])``, ``("removed", key)``,
        ``("cleared", None)``. Empty without ``events=True``."""
    def __len__(self) -> int: ...

def block_hashes(tokens: _Tokens, block_size: int = 16) -> list[int]:
    """The chained hash values of ``tokens``' full blocks of ``block_size``
    tokens, as ``Sequence(tokens, block_size).hashes`` computes them."""

def group_of(value: int) -> int:
    """The KV cache group a chained hash value belongs to (its top 8 bits):
    0 for a model of one group, ``g`` for the blocks of group ``g`` of a
    ``Scheduler`` built with ``model=`` or ``groups=`` (as in its
    ``take_events``). Raises ``OverflowError`` outside ``0 .. 2**128``."""

def without_group(value: int) -> int:
    """A chained hash value without its KV cache group: the same for every
    group's block of one prefix, as vLLM sends block hashes."""

# The block pool --------------------------------------------------------------

@final
class BlockPool:
    """A pool of KV-cache blocks with a prefix cache (kvbm-blocks'
    ``BlockManager``).

    Blocks are named by their ids (``0 .. num_blocks``, usable as page
    indices). ``allocate`` hands out blocks, ``register`` publishes full
    ones under their chained hashes, ``match_prefix`` finds the longest
    cached prefix of a request in one call, and ``release`` gives blocks
    back: a registered block whose last reference is released stays cached
    (matchable) until an allocation needs room. Releasing a block this pool
    does not hold raises ``PoolError``: there is no double free.
    """

    def __new__(
        cls,
        num_blocks: int,
        block_size: int = 16,
        *,
        eviction: _Eviction = "lru",
        duplicates: Literal["deduplicate", "allow"] = "deduplicate",
        events: bool = False,
        event_capacity: int = 1024,
    ) -> BlockPool:
        """A pool of ``num_blocks`` blocks of ``block_size`` tokens.

        ``duplicates="deduplicate"``: registering a hash already registered
        returns the registered block and frees the new one. With
        ``events=True`` the pool records cache events for ``take_events``
        (at most ``event_capacity`` batches wait; a reader that falls
        behind gets a resync, never a silent gap).

        Raises ``InvalidArgumentError`` for a zero or oversized pool.
        """
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def eviction(self) -> _Eviction:
        """The eviction policy's name."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation could get now: free plus cached (evictable)."""
    @property
    def usage(self) -> float:
        """The fraction of blocks in use (held by someone), 0.0 to 1.0."""
    @property
    def num_held(self) -> int:
        """Distinct blocks Python holds through this pool object."""
    def allocate(self, count: int) -> list[int]:
        """Allocates ``count`` blocks, all or none, evicting cached blocks
        when the free ones run out; returns their ids.

        Raises ``PoolExhaustedError`` if not enough are free or evictable.
        """
    def register(
        self,
        block_ids: _Seq[int],
        hashes: _Hashes | None = None,
        *,
        tokens: _Tokens | None = None,
        parent: int | None = None,
        position: int | None = None,
    ) -> list[int]:
        """Publishes allocated blocks, full, under chained hashes: each
        becomes matchable by every request. Returns the ids now holding
        them, in order (a hash already registered returns the registered
        block, and the one given is freed).

        ``hashes`` are the blocks' chained hash values, or a ``Sequence`` to
        take its hashes from ``position`` on; without them ``tokens``
        (``block_size`` per block) are hashed as ``Sequence`` hashes them.
        ``parent`` is the value of the block before the first, ``position``
        the first block's index. ``tokens`` given with ``hashes`` ride along
        in the ``stored`` events. All or none: on error every block stays
        allocated.
        """
    def match_prefix(self, hashes: _Hashes) -> list[int]:
        """The longest cached prefix of a request's chained block hashes
        (from its first block), one call per request. Returns the ids of the
        blocks found, in order, each with one more reference for the caller
        to ``release``."""
    def contains(self, hashes: _Hashes) -> list[bool]:
        """Which of ``hashes`` are registered now (held or cached), without
        the prefix rule and without touching anything."""
    def release(self, block_ids: _Seq[int]) -> None:
        """Gives back one reference per id listed (an id may appear once per
        reference held). An allocated block returns to the free pool; a
        registered one is cached once its last reference is gone, last
        listed first: a request's block table, in page order, is evicted
        tail first.

        All or none: an id this pool does not hold (or listed more often
        than held) raises ``PoolError`` and nothing is released.
        """
    def ref_count(self, block_id: int) -> int:
        """References Python holds on block ``block_id`` (0 if none)."""
    def clear_cache(self) -> int:
        """Evicts every cached block (none is held) to the free pool; returns
        how many were evicted."""
    def take_events(self) -> list[dict[str, Any]]:
        """The cache events since the last call, oldest first (needs
        ``events=True``):

        - ``{"type": "stored", "batch": int, "parent": int | None,
          "hashes": list[int], "tokens": list[int]}``: consecutive blocks of
          one sequence became matchable;
        - ``{"type": "removed", "batch": int, "hashes": list[int]}``: evicted;
        - ``{"type": "cleared", "batch": int}``: ``clear_cache`` emptied all;
        - ``{"type": "resync", "batch": int, "missed_batches": int,
          "registered": list[int]}``: start over from this set (the first
          message, and after batches were lost to a full channel).
        """
    def metrics(self) -> dict[str, int]:
        """Occupancy (``total_blocks``, ``free_blocks``, ``inactive_blocks``,
        ``in_use_blocks``) and lifetime counters (``allocations``,
        ``registrations``, ``deduplications``, ``match_hashes_requested``,
        ``match_hashes_hit``, ``evictions``), read at one instant."""
    def audit(self) -> dict[str, int]:
        """Recounts every block (O(blocks)). Raises ``PoolError`` if the pool
        is inconsistent (a bug in kvbm)."""

# Sequences -------------------------------------------------------------------

@final
class Sequence:
    """A request's tokens cut into full blocks of ``block_size`` plus a
    partial tail, each full block named by a hash chained from its parent's
    (XXH3, rooted in an optional salt). Two sequences share block ``i``'s
    hash exactly when they share the salt and every token up to the end of
    block ``i``: the hash is the prefix-cache key. Iterating yields its
    tokens."""

    def __new__(
        cls, tokens: _Tokens, block_size: int = 16, *, salt: str | bytes | None = None
    ) -> Sequence: ...
    @property
    def tokens(self) -> list[int]:
        """The tokens."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def num_blocks(self) -> int:
        """Full blocks."""
    @property
    def hashes(self) -> list[int]:
        """The full blocks' chained hash values (ints in ``0 .. 2**128``)."""
    @property
    def packed_hashes(self) -> bytes:
        """The hash values packed, 16 little-endian bytes each."""
    @property
    def partial_tokens(self) -> list[int]:
        """The tokens after the last full block."""
    def block_tokens(self, index: int) -> list[int] | None:
        """The tokens of full block ``index`` (``None`` past the full blocks)."""
    def append(self, token: int) -> int | None:
        """Appends one token; returns the index of the block it completed."""
    def extend(self, tokens: _Tokens) -> range:
        """Appends tokens; returns the ``range`` of blocks they completed."""
    def truncate(self, length: int) -> None:
        """Keeps the first ``length`` tokens. Raises ``SequenceError`` past
        the end."""
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[int]: ...

@final
class RequestSequence:
    """One request's tokens and the blocks backing them in a ``BlockPool``:
    match the cached prefix, allocate, register, append generated tokens,
    release and reacquire, each an explicit call (no scheduling policy).
    While it holds blocks it belongs to one pool; its blocks stay valid
    after that pool object is gone."""

    def __new__(
        cls,
        tokens: _Tokens,
        max_output_tokens: int,
        block_size: int = 16,
        *,
        salt: str | bytes | None = None,
    ) -> RequestSequence: ...
    def match_prefix(self, pool: BlockPool) -> int:
        """Takes the longest cached prefix of its full blocks in ``pool``;
        returns how many blocks hit."""
    def allocate_blocks(self, count: int, pool: BlockPool) -> None:
        """Allocates ``count`` blocks from ``pool``, all or none (raises
        ``PoolExhaustedError``)."""
    def allocate_for(self, pool: BlockPool, num_tokens: int | None = None) -> int:
        """Allocates what covering the first ``num_tokens`` positions (all
        its tokens by default) still needs; returns how many."""
    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks still to allocate to cover the first ``num_tokens``."""
    def register_pending(self, pool: BlockPool, up_to: int | None = None) -> int:
        """Stages and registers every full block an allocated block can back
        (only those below ``up_to``, if given); returns how many."""
    def append_token(self, token: int) -> int | None:
        """Appends a generated token; returns the index of the block it
        filled. Raises ``SequenceError`` past ``max_output_tokens``."""
    def append_tokens(self, tokens: _Tokens) -> range:
        """Appends generated tokens, all or none; returns the blocks filled."""
    def truncate(self, length: int) -> None:
        """Rolls back to the first ``length`` tokens (rejected drafts)."""
    def release_unassigned(self, count: int) -> int:
        """Gives back up to ``count`` allocated, unused blocks (last first)."""
    def release(self) -> None:
        """Gives every block back (registered ones stay cached)."""
    def reacquire(self, pool: BlockPool) -> int:
        """After ``release``, matches the cached prefix again; returns hits."""
    @property
    def tokens(self) -> list[int]: ...
    @property
    def hashes(self) -> list[int]: ...
    @property
    def packed_hashes(self) -> bytes: ...
    @property
    def block_ids(self) -> list[int]:
        """The ids of the blocks backing it, in page order."""
    @property
    def total_tokens(self) -> int: ...
    @property
    def num_input_tokens(self) -> int: ...
    @property
    def generated_tokens(self) -> int: ...
    @property
    def max_output_tokens(self) -> int: ...
    @property
    def remaining_tokens(self) -> int: ...
    @property
    def is_complete(self) -> bool: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def assigned_blocks(self) -> int: ...
    @property
    def staged_blocks(self) -> int: ...
    @property
    def unassigned_blocks(self) -> int: ...
    @property
    def pending_blocks(self) -> int: ...
    @property
    def held_blocks(self) -> int: ...
    @property
    def prefix_matched_blocks(self) -> int: ...
    @property
    def new_tokens_for_prefill(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    def __len__(self) -> int: ...

# The scheduler ---------------------------------------------------------------

@final
class Finished:
    """A request that left the scheduler."""

    @property
    def request_id(self) -> int: ...
    @property
    def reason(self) -> _Reason: ...
    @property
    def generated_tokens(self) -> int: ...

@final
class PrefillWork:
    """Compute the KV of tokens ``start .. start + num_tokens``;
    ``emits_token`` when the chunk ends the prompt. ``new_blocks`` extend
    the request's block table (they are the whole table when ``resumed``)."""

    @property
    def request_id(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def emits_token(self) -> bool: ...
    @property
    def new_blocks(self) -> list[int]: ...
    @property
    def resumed(self) -> bool: ...
    @property
    def groups(self) -> list[tuple[int, list[int]]]:
        """With KV cache groups, each group's ``(first_block, new_blocks)``
        on a step that changes the tables (``new_blocks`` repeats the first
        group's); empty on the other steps and for one group."""

@final
class DecodeWork:
    """Compute the KV of the token at ``position`` (and ``draft_tokens``
    drafts after it) and sample the next."""

    @property
    def request_id(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def draft_tokens(self) -> int: ...
    @property
    def new_blocks(self) -> list[int]: ...
    @property
    def resumed(self) -> bool: ...
    @property
    def groups(self) -> list[tuple[int, list[int]]]:
        """As ``PrefillWork.groups``."""

@final
class Transfer:
    """A copy between tiers the engine runs, then reports by
    ``transfer_id`` (``Scheduler.report_transfers``). ``kind`` is
    ``"store"`` (down the tiers) or ``"load"`` (up to the device, for a
    request onboarding); ``source`` and ``destination`` are tier levels (0
    the device, 1 the host, 2 the disk); ``runs`` are ``(source_block,
    destination_block, blocks)`` of consecutive ids on both sides, one copy
    each; ``hashes`` are the blocks' chained hashes in the runs' order.
    Until it is reported its sources are pinned and its destinations held."""

    @property
    def transfer_id(self) -> int: ...
    @property
    def kind(self) -> Literal["store", "load"]: ...
    @property
    def source(self) -> int: ...
    @property
    def destination(self) -> int: ...
    @property
    def runs(self) -> list[tuple[int, int, int]]: ...
    @property
    def hashes(self) -> list[int]: ...
    @property
    def num_blocks(self) -> int: ...

@final
class StepPlan:
    """One engine iteration. Iterating yields the prefill chunks, then the
    decodes; ``len()`` counts them."""

    @property
    def step(self) -> int: ...
    @property
    def prefill(self) -> list[PrefillWork]: ...
    @property
    def decode(self) -> list[DecodeWork]: ...
    @property
    def request_ids(self) -> list[int]:
        """Ids of the requests scheduled, prefill chunks first."""
    @property
    def transfers(self) -> list[Transfer]:
        """Copies between tiers to run (a scheduler with lower tiers): the
        stores of blocks registered since the last plan and the loads of
        requests onboarding. Report each when it ends."""
    @property
    def preempted(self) -> list[int]:
        """Requests preempted this step (their blocks are gone; they wait)."""
    @property
    def finished(self) -> list[Finished]:
        """Requests that left while planning."""
    @property
    def num_tokens(self) -> int: ...
    @property
    def is_empty(self) -> bool: ...
    def sample_all(self, token: int) -> dict[int, int | None]:
        """The outputs of an engine that samples ``token`` wherever one is
        due (``None`` for chunks that sample nothing): for tests and
        simulations, to pass to ``Scheduler.apply``."""
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[PrefillWork | DecodeWork]: ...

@final
class StepReport:
    """What applying a step changed."""

    @property
    def step(self) -> int: ...
    @property
    def first_tokens(self) -> list[int]:
        """Requests that produced their first token this step."""
    @property
    def generated_tokens(self) -> int: ...
    @property
    def finished(self) -> list[Finished]: ...
    @property
    def verified_draft_tokens(self) -> int: ...
    @property
    def accepted_draft_tokens(self) -> int: ...
    @property
    def rolled_back(self) -> dict[int, list[int]]:
        """Blocks given back after speculative steps, by request."""
    @property
    def rolled_back_groups(self) -> dict[int, list[list[int]]]:
        """With KV cache groups, each group's blocks given back after
        speculative steps, by request (a list per group, in group order)."""

@final
class Scheduler:
    """A continuous-batching scheduler over a block pool of its own
    (kvbm-queue's ``Scheduler``): ``submit`` requests, then each step call
    ``step()`` for the plan, run the model, and ``apply()`` what it sampled.
    Admission, chunked prefill, prefix caching and preemption happen
    inside. Any thread may submit or cancel while another steps."""

    def __new__(
        cls,
        num_blocks: int,
        block_size: int = 16,
        *,
        max_running: int = 256,
        token_budget: int = 8192,
        chunk_size: int = 2048,
        watermark_blocks: int | None = None,
        reserve: int | Literal["full"] | None = None,
        prefix_credit: bool = True,
        speculative_tokens: int = 0,
        preemption: Literal["never", "priority"] = "never",
        eviction: _Eviction = "lru",
        events: bool = False,
        model: _Model | None = None,
        groups: str | None = None,
        host_blocks: int | None = None,
        disk_blocks: int | None = None,
        offload: str = "write-through",
        max_onboarding_blocks: int = 4096,
        load_timeout_steps: int = 256,
    ) -> Scheduler:
        """A scheduler over a new pool of ``num_blocks`` blocks. The limits
        default to vLLM's; ``watermark_blocks`` defaults to 1% of the pool,
        ``reserve`` (generated tokens admission reserves) to 256.

        ``model`` (a preset) or ``groups`` (the layers by kind, e.g.
        ``"sliding_window:128:18,full:18"``) runs the model's KV cache
        groups, made as vLLM makes them: each request holds a table per
        group, and a sliding window's blocks behind it go back to the cache
        as it advances. Raises ``InvalidArgumentError`` for an unknown
        model, a description that does not parse, or a window that is not
        a multiple of ``block_size``.

        ``host_blocks`` (and below it ``disk_blocks``) adds lower tiers:
        blocks are copied down as ``offload`` says (``"write-through"``,
        ``"write-back"`` or ``"selective:K"``), and a request whose prefix a
        lower tier holds waits onboarding (``census()["onboarding"]``; at
        most ``max_onboarding_blocks`` loads at once, ``load_timeout_steps``
        steps) while the engine runs the plans' ``transfers`` and reports
        them with ``report_transfers``. With ``model`` or ``groups`` every
        group's blocks go down, and each group loads only the blocks it
        reads for the hit."""
    def submit(
        self,
        request_id: int,
        prompt: _Tokens,
        max_new_tokens: int,
        *,
        priority: _Priority = "normal",
        salt: str | bytes | None = None,
    ) -> None:
        """Queues a request. Raises ``SchedulerError`` for an id already
        live or a request larger than the whole pool,
        ``InvalidArgumentError`` for an empty prompt."""
    def cancel(self, request_id: int) -> bool:
        """Ends a request wherever it is; the next ``step`` or ``apply``
        reports it (``"cancelled"``). Returns whether it was live."""
    def abort(self, request_id: int) -> Finished:
        """Takes a request out at once. Raises ``SchedulerError`` if it is
        neither waiting nor running."""
    def step(self) -> StepPlan:
        """Plans the next engine step. Raises ``SchedulerError`` if the last
        plan was not applied yet."""
    def apply(
        self,
        outputs: Mapping[int, int | None | _Seq[int]],
        *,
        stop: Iterable[int] | None = None,
    ) -> StepReport:
        """Commits what the engine sampled for the pending plan: per
        scheduled request its token, ``None`` for a chunk that samples
        nothing, or the accepted drafts followed by the sampled token.
        ``stop`` lists requests that end with this token. Raises
        ``SchedulerError`` (nothing changes) for a missing, extra or
        malformed output."""
    @property
    def is_idle(self) -> bool:
        """Whether nothing waits or runs and every request was reported."""
    def is_running(self, request_id: int) -> bool: ...
    @property
    def running_ids(self) -> list[int]: ...
    def block_table(self, request_id: int) -> list[int] | None:
        """A running request's block table (its first KV cache group's)."""
    def group_block_table(self, request_id: int, group: int) -> tuple[int, list[int]] | None:
        """KV cache group ``group``'s table of a running request as
        ``(first_block, blocks)``: the index of the first block it still
        holds and the blocks from there on; ``None`` if it is not running
        or there is no such group."""
    def held_blocks_by_group(self) -> list[int]:
        """Blocks the running requests hold, per KV cache group."""
    def report_transfers(
        self, completed: Iterable[int] = (), failed: Iterable[int] = ()
    ) -> None:
        """Reports the engine's transfers by id: ``completed`` copied every
        block, ``failed`` did not (none of their blocks count; a request
        waiting for a failed load computes its prefix instead). All or
        nothing: an id never planned, already reported or given twice
        raises ``SchedulerError`` and nothing changes."""
    def take_transfers(self) -> list[Transfer]:
        """Transfers planned since the last ``step``, for an engine that
        starts them at once rather than with the next plan."""
    @property
    def transfers_in_flight(self) -> int:
        """Transfers planned and not yet reported."""
    def onboard_stats(self) -> dict[str, Any]:
        """``requests`` that waited for loads, the ``blocks`` they waited
        for, ``loaded_from`` (per lower tier, host first), ``timeouts``,
        ``stall_steps`` and ``declined``."""
    def slot_mapping(self, plan: StepPlan, group: int = 0) -> array.array[int]:
        """The pending step's slot mapping (vLLM's ``slot_mapping``) in KV
        cache group ``group``: the KV slot (``block id × block size +
        offset``) of every token ``plan`` computes, prefill chunks first,
        as an ``array.array('q')`` of int64; -1 (vLLM's ``PAD_SLOT_ID``)
        for a token of a request that left after planning or of a group
        the model does not have. Raises ``SchedulerError`` unless ``plan``
        is the step awaiting ``apply``."""
    @property
    def kv_groups(self) -> list[tuple[str, int | None, int]] | None:
        """The KV cache groups as ``(kind, span, layers)``; ``None`` for a
        one-group scheduler."""
    def tokens(self, request_id: int) -> list[int] | None:
        """A running request's tokens, prompt and generated."""
    def run_decodes_in_place(self, max_steps: int, *, token: int = 0) -> tuple[int, int]:
        """For simulators: runs up to ``max_steps`` steps at once while each
        is every running request decoding one token (``token``) inside the
        blocks it holds, with the effects of as many ``step()`` +
        ``apply()`` pairs; stops before the first step that would do more.
        Returns ``(steps, requests)``: the steps run and the requests that
        decoded in each."""
    def census(self) -> dict[str, int]:
        """Where every request is (``submitted == waiting + onboarding +
        running + finished + aborted``) and the lifetime counters."""
    def metrics(self) -> dict[str, float | int]:
        """Gauges and counters under vLLM's names: ``kv_cache_usage``,
        ``num_requests_running``, ``num_requests_waiting``,
        ``prefix_cache_queries``, ``prefix_cache_hits``,
        ``num_preemptions``, ``generation_tokens``, ``evictions``."""
    def pool_metrics(self) -> dict[str, int]:
        """The pool's occupancy and counters (as ``BlockPool.metrics``)."""
    def audit(self) -> dict[str, int]:
        """Checks that every request and block is accounted for; returns
        the census. Raises ``SchedulerError`` otherwise (a kvbm bug)."""
    def take_events(self) -> list[dict[str, Any]]:
        """The pool's cache events since the last call (as
        ``BlockPool.take_events``); needs ``events=True``."""
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...

# The simulator ---------------------------------------------------------------

_TraceArg = Union["Trace", str, PathLike[str], list[dict[str, Any]], None]

@final
class Trace:
    """A request trace in the Mooncake format (per request an arrival
    ``timestamp`` in ms, ``input_length``, ``output_length``, one
    ``hash_ids`` entry per 512-token prompt block, optionally a vLLM
    ``priority``), parsed and checked once for any number of replays."""

    @staticmethod
    def excerpt() -> Trace:
        """The embedded excerpt of the Mooncake conversation trace (500
        requests): every replay's default."""
    @staticmethod
    def load(path: str | PathLike[str]) -> Trace:
        """Reads and checks a JSONL trace file (raises ``SimError``)."""
    @staticmethod
    def from_jsonl(text: str) -> Trace: ...
    @staticmethod
    def from_requests(requests: list[dict[str, Any]]) -> Trace: ...
    @property
    def source(self) -> str: ...
    def summary(self) -> dict[str, int | float]: ...
    def requests(self) -> list[dict[str, Any]]: ...
    def __len__(self) -> int: ...

def replay_cache(
    trace: _TraceArg = None,
    *,
    block_size: int = 512,
    capacity_blocks: int | None = None,
    capacity_tokens: int | None = None,
    eviction: _Eviction = "lru",
    host_tier_tokens: int | None = None,
    disk_tier_tokens: int | None = None,
    offload: str = "write-through",
) -> dict[str, Any]:
    """Cache mode: the trace's requests one after another through a prefix
    cache (unbounded unless a capacity is given); the report of
    ``kvbm-sim cache --json``. Releases the GIL while it runs."""

def replay_serve(
    trace: _TraceArg = None,
    *,
    limit: int | None = None,
    data_plane: str | None = None,
    block_size: int = 16,
    capacity_blocks: int | None = None,
    capacity_tokens: int | None = None,
    eviction: _Eviction = "lru",
    max_running: int = 256,
    token_budget: int = 8192,
    chunk_size: int = 2048,
    watermark_blocks: int | None = None,
    reserve: int | Literal["full"] = 256,
    prefix_credit: bool = True,
    spec_tokens: int = 0,
    spec_accept: float = 0.7,
    seed: int = 0,
    priorities: str | None = None,
    priority_preemption: bool = False,
    aging_per_s: float = 0.0,
    preemption_boost: int = 0,
    step_ms: float = 5.0,
    prefill_token_ms: float = 0.05,
    decode_request_ms: float = 0.1,
    audit_every: int = 0,
    host_tier_tokens: int | None = None,
    disk_tier_tokens: int | None = None,
    offload: str = "write-through",
    kv_bytes_per_token: int | None = None,
    host_link_gbps: float = ...,
    host_link_setup_us: float = ...,
    disk_link_gbps: float = ...,
    disk_link_setup_us: float = ...,
    model: _Model | None = None,
    groups: str | None = None,
    kv_bytes_per_token_layer: int | str | None = None,
    capacity_bytes: int | str | None = None,
    full_attention_only: bool = False,
) -> dict[str, Any]:
    """Serve mode: arrivals at their timestamps into the scheduler, in
    simulated time (a 3M-token pool by default); the report of
    ``kvbm-sim serve --json``: TTFT and TPOT percentiles, throughput,
    preemptions, hit rates. Releases the GIL while it runs.

    ``model`` (a preset) or ``groups`` (the layers by kind, e.g.
    ``"sliding_window:128:18,full:18"``, with ``kv_bytes_per_token_layer``)
    runs the model's KV cache groups in ``capacity_bytes`` of KV memory
    (an int or text such as ``"40G"``; not with ``capacity_blocks`` or
    ``capacity_tokens``); ``full_attention_only`` treats every layer as
    full attention at the same bytes. The report gains ``kv_groups`` and
    ``peak_kv_bytes``; tiers below the GPU then hold the model's blocks
    (``host_tier_tokens`` tokens of its KV, every group's; ``data_plane``
    moves them as real bytes), so ``kv_bytes_per_token`` (131072 by
    default, an 8B model) is not given with one. Raises ``InvalidArgumentError`` for options that do not go
    together, as the command line refuses its flags."""

def replay_cluster(
    trace: _TraceArg = None,
    *,
    limit: int | None = None,
    engines: int = 16,
    replicate: int = 1,
    policies: str | list[str] | None = None,
    overlap_weight: float = 1.0,
    temperature: float = 0.0,
    threads: int | None = None,
    memory_limit_gb: float = 12.0,
    global_pool_tokens: int | None = None,
    network_gbps: float = ...,
    network_setup_us: float = ...,
    pool_only_for_global_kv: bool = False,
    **engine: Any,
) -> dict[str, Any]:
    """Cluster mode: arrivals routed over ``engines`` serve-mode engines
    (every ``replay_serve`` engine option applies to each, a model's
    ``model``/``groups`` and ``capacity_bytes`` included), once per routing
    policy (``"random"``, ``"round-robin"``, ``"least-loaded"``,
    ``"kv-aware"``, ``"global-kv"``); the report of
    ``kvbm-sim cluster --json``. Releases the GIL while it runs."""
