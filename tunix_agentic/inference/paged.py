"""The paged KV layout's host side: a block allocator and one block table per slot (no JAX).

With ``EngineConfig.kv_layout="paged"`` the device holds, per layer, one pool of
``kv_blocks`` blocks of ``kv_block_size`` tokens (``[blocks, kv_heads, block_size,
head_dim]`` for K and for V; for ``model.attention: pallas`` one ``[blocks, block_size,
2 x kv_heads, head_dim]`` array, the TPU kernel's own layout) instead of ``max_slots x
max_seq_len`` rows. Slot ``s`` reads and writes
position ``p`` in block ``tables[s, p // block_size]`` at offset ``p % block_size``
(:class:`~tunix_agentic.models.transformer.Attention`), so a slot holds only the blocks
its tokens need.

Blocks are reference counted. A request that reuses a cached prompt prefix shares the
prefix's *full* blocks with the slot that holds it (a GRPO group's G samples hold their
prompt once); the one partly filled block it would write into is copied to a fresh block
on device first (copy on write). A block returns to the free list when its last holder
lets it go: an active request that ends (its slot keeps only the blocks of what stays
cached), a parked session or a cached free slot that is evicted for room.

Admission never over-commits: a request is admitted only when the blocks of its whole
``prompt + max_new_tokens`` are free or promised to nobody (``reserved``), so a request
in flight always gets the blocks it grows into (:meth:`PagedKV.grow`) and the engine never
runs out mid-decode; a request that must wait, waits in the queue.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tunix_agentic.inference.config import EngineConfig
from tunix_agentic.inference.slots import SlotTable


@dataclasses.dataclass(frozen=True)
class BlockCopy:
    """Copy block ``src`` to block ``dst`` on device before a prefill (copy on write)."""

    src: int
    dst: int


class BlockAllocator:
    """A free list of block ids with a reference count per block."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.refs = np.zeros(num_blocks, np.int32)
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() takes block 0 first

    def alloc(self) -> int:
        if not self.free:
            raise RuntimeError("paged KV: no free block (admission reserves blocks; a bug)")
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.refs[block] < 1:
            raise RuntimeError(f"paged KV: block {block} is not allocated")
        self.refs[block] += 1

    def decref(self, block: int) -> None:
        if self.refs[block] < 1:
            raise RuntimeError(f"paged KV: block {block} freed twice")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)

    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free)


class PagedKV:
    """Block tables of ``num_slots`` slots over one :class:`BlockAllocator`.

    ``tables`` (``[slots, blocks_per_seq]`` int32) is what the device step reads; entries
    past a slot's ``count`` hold ``num_blocks`` (a block that does not exist: writes there
    are dropped, reads are masked as positions past the slot's end).
    """

    def __init__(self, num_slots: int, max_seq_len: int, block_size: int, num_blocks: int):
        self.block_size = block_size
        self.width = -(-max_seq_len // block_size)
        if num_blocks < self.width:
            raise ValueError(
                f"a pool of {num_blocks} blocks cannot hold one sequence of {max_seq_len} tokens"
            )
        self.blocks = BlockAllocator(num_blocks)
        self.tables = np.full((num_slots, self.width), num_blocks, np.int32)
        self.count = np.zeros(num_slots, np.int64)  # blocks each slot holds (a prefix of its row)
        self.reserved = np.zeros(num_slots, np.int64)  # blocks promised to its request
        self.peak_used = 0

    @classmethod
    def of(cls, config: EngineConfig) -> PagedKV | None:
        """The engine's block tables; None for the dense layout."""
        if config.kv_layout != "paged":
            return None
        return cls(config.max_slots, config.max_seq_len, config.kv_block_size, config.num_kv_blocks)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def available(self) -> int:
        """Free blocks promised to no request in flight."""
        return len(self.blocks.free) - int(self.reserved.sum())

    @property
    def batch_shape(self) -> dict[str, int]:
        """``PrefillBatch.host``'s arguments for this layout's block tables."""
        return {"table_width": self.width, "num_blocks": self.blocks.num_blocks}

    def fill_prefill_row(self, batch, row: int, slot: int, copy: BlockCopy | None) -> None:
        """Set a :class:`~.device_step.PrefillBatch` row's block table and block copy."""
        batch.tables[row] = self.tables[slot]
        if copy is not None:
            batch.block_src[row], batch.block_dst[row] = copy.src, copy.dst

    def held(self, slot: int) -> list[int]:
        return [int(b) for b in self.tables[slot, : self.count[slot]]]

    def assign(
        self, slot: int, source: int, cached: int, prompt_len: int, total: int
    ) -> BlockCopy | None:
        """Give ``slot`` the table of a new request: the first ``cached`` tokens' KV from
        ``source``'s blocks (shared; the partly filled last one copied unless ``slot``
        alone holds it), fresh blocks for the rest of its ``prompt_len`` tokens, and a
        reservation up to ``total`` tokens. The slot's previous blocks are let go.
        The caller checked that ``blocks_for(total)`` blocks are :attr:`available`."""
        bs = self.block_size
        old = self.held(slot)
        src = self.held(source)
        full, part = divmod(cached, bs)
        if full + (1 if part else 0) > len(src):
            raise RuntimeError(f"paged KV: slot {source} holds no KV for {cached} tokens")
        new = src[:full]
        for block in new:
            self.blocks.incref(block)
        copy = None
        if part:
            block = src[full]
            if source == slot and self.blocks.refs[block] == 1:
                self.blocks.incref(block)  # its own, shared with no one: written in place
                new.append(block)
            else:
                new.append(self.blocks.alloc())
                copy = BlockCopy(block, new[-1])
        while len(new) < self.blocks_for(prompt_len):
            new.append(self.blocks.alloc())
        for block in old:
            self.blocks.decref(block)
        self._set(slot, new)
        self.reserved[slot] = self.blocks_for(total) - len(new)
        return copy

    def grow(self, slot: int, tokens: int) -> None:
        """Let ``slot`` hold blocks for ``tokens`` tokens, from its reservation."""
        need = self.blocks_for(tokens) - int(self.count[slot])
        if need <= 0:
            return
        if need > self.reserved[slot]:
            raise RuntimeError(f"paged KV: slot {slot} grows past its reservation")
        new = self.held(slot) + [self.blocks.alloc() for _ in range(need)]
        self.reserved[slot] -= need
        self._set(slot, new)

    def trim(self, slot: int, tokens: int) -> None:
        """Keep only the blocks of ``slot``'s first ``tokens`` tokens; drop its reservation."""
        blocks = self.held(slot)
        keep = min(len(blocks), self.blocks_for(tokens))
        for block in blocks[keep:]:
            self.blocks.decref(block)
        self.reserved[slot] = 0
        self._set(slot, blocks[:keep])

    def release(self, slot: int) -> None:
        """``slot`` holds nothing any more."""
        self.trim(slot, 0)

    def _set(self, slot: int, blocks: list[int]) -> None:
        self.tables[slot] = self.blocks.num_blocks
        self.tables[slot, : len(blocks)] = blocks
        self.count[slot] = len(blocks)
        self.peak_used = max(self.peak_used, self.blocks.used)


# ------------------------------------------------ the scheduler's paged bookkeeping
# Functions over a PagedKV and the slot table (kept here so the scheduler stays one job).
def make_room(paged: PagedKV, slots: SlotTable, session_id: str | None, tokens: int) -> bool:
    """Whether the blocks of a request of ``tokens`` tokens are available, after dropping
    cached KV the slot table may lose (free slots' prefixes, then parked sessions, the
    request's own session last) if they are not. False: the request waits."""
    need = paged.blocks_for(tokens)
    if need > paged.blocks.num_blocks:  # EngineConfig's checks make this unreachable
        raise ValueError(f"a request of {tokens} tokens can never fit the KV pool")
    victims = iter(slots.reclaimable(session_id))
    while paged.available < need:
        slot = next(victims, None)
        if slot is None:
            return False
        slots.forget(slot)
        paged.release(slot)
    return True


def keeps_kv(slots: SlotTable, slot: int) -> bool:
    """Whether the slot table counts on ``slot``'s KV (active, parked, a kept prefix)."""
    return slot in slots.active or slot in slots.parked or slot in slots.held


def keep_cached(paged: PagedKV | None, slots: SlotTable, slot: int) -> None:
    """``slot``'s request ended: keep the blocks of what the slot table still caches there
    (a parked session's tokens, a free slot's prompt), give back the rest (dense: nothing
    to do)."""
    if paged is None:
        return
    if slot in slots.parked:
        paged.trim(slot, len(slots.parked[slot].ids))
    elif slot in slots.held and slot not in slots.active:
        paged.trim(slot, len(slots.held[slot].ids))
    else:
        paged.release(slot)


def release_forgotten(paged: PagedKV | None, slots: SlotTable) -> None:
    """Give back the blocks of every slot whose KV the slot table no longer counts on (a
    weight update dropped parked caches and shared prefixes); dense: nothing to do."""
    if paged is None:
        return
    for slot in range(len(paged.count)):
        if paged.count[slot] and not keeps_kv(slots, slot):
            paged.release(slot)


def chunk_tables(paged: PagedKV | None, active: dict, config: EngineConfig) -> np.ndarray:
    """Before a decode chunk: blocks for every position it may write, and the block tables
    it reads (``[slots, blocks_per_seq]``; dense: ``[slots, 0]``). The token fed at step ``k`` of the
    chunk sits at ``prompt + generated - 1 + k`` (generated counts tokens dispatched and
    not yet collected), and never past ``prompt + max_new``."""
    if paged is None:
        return np.zeros((config.max_slots, 0), np.int32)
    for slot, req in active.items():
        n = len(req.prompt)
        fed = n + len(req.tokens) + req.pending - 1
        paged.grow(slot, min(fed + config.decode_steps, n + req.max_new))
    return paged.tables.copy()


def kv_gauges(slots: SlotTable, paged: PagedKV | None, config: EngineConfig) -> dict[str, int]:
    """What the engine's KV holds now: ``kv_tokens_held`` (tokens whose KV is cached, a
    shared prefix once per holder), ``kv_tokens_reserved`` (set aside on device: the dense
    cache, or the block pool), and, paged, blocks used / peak / total."""
    held = sum(len(r.prompt) + len(r.tokens) for r in slots.active.values())
    held += sum(len(p.ids) for p in slots.parked.values())
    held += sum(len(h.ids) for slot, h in slots.held.items() if slot in slots.free)
    if paged is None:
        return {"kv_tokens_held": held, "kv_tokens_reserved": config.max_slots * config.max_seq_len}
    blocks = paged.blocks
    return {
        "kv_tokens_held": held,
        "kv_tokens_reserved": blocks.num_blocks * paged.block_size,
        "kv_blocks_used": blocks.used,
        "kv_blocks_peak": paged.peak_used,
        "kv_blocks_total": blocks.num_blocks,
    }
