"""Admission: waiting requests into free slots, and their prefill planned in batches.

The scheduler thread (:mod:`~tunix_agentic.inference.scheduler`) asks, once per
iteration, which waiting requests start now (:meth:`Admission.admit`: first come, first
served, while the :class:`~tunix_agentic.inference.slots.SlotTable` grants a slot, and,
paged, the blocks they need), then how to prefill them (:meth:`Admission.plan_prefill`:
by reuse wave and bucketed new length, at most ``max_slots`` rows a call, so shapes
repeat) and the host side of each call (:meth:`Admission.prefill_batch`). The device
calls themselves stay the scheduler's.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tunix_agentic.inference.config import EngineConfig, bucket
from tunix_agentic.inference.device_step import PrefillBatch, RowSampling
from tunix_agentic.inference.paged import PagedKV, make_room
from tunix_agentic.inference.request import Request
from tunix_agentic.inference.slots import SlotTable


class Admission:
    """The wait queue and the prefill plans of one scheduler.

    Shares the scheduler's ``slots``, ``paged`` block tables (None: dense), per-slot host
    ``sampling`` rows and ``stop`` flags, and its ``counters`` (``prefill_tokens``,
    ``cached_tokens``).
    """

    def __init__(
        self,
        config: EngineConfig,
        slots: SlotTable[Request],
        paged: PagedKV | None,
        sampling: RowSampling,
        stop: np.ndarray,
        counters: dict[str, float],
    ):
        self.config, self.slots, self.paged = config, slots, paged
        self.sampling, self.stop, self.counters = sampling, stop, counters
        self.queue: deque[Request] = deque()  # submitted, waiting for a slot

    def admit(self, version: int) -> list[Request]:
        """Start waiting requests, in order, while slots (and, paged, blocks) are free; each
        gets its slot, the prefix it reuses (cached under ``version``) and its sampling row."""
        admitted = []
        self.slots.new_round()
        while self.queue:
            req = self.queue[0]
            total, paged = len(req.prompt) + req.max_new, self.paged
            if paged and not make_room(paged, self.slots, req.session_id, total):
                break  # waits until requests in flight give blocks back
            grant = self.slots.grant(req.session_id, req.prompt, version)
            if grant is None:
                break
            self.queue.popleft()
            slot = grant.slot
            req.slot, req.cached, req.grant = slot, grant.cached, grant
            if paged:
                req.block_copy = paged.assign(
                    slot, grant.source, grant.cached, len(req.prompt), total
                )
            self.slots.activate(slot, req)
            s = req.sampling
            self.sampling.set_row(slot, s.temperature, s.top_k, s.top_p, s.stop_token_ids)
            self.stop[slot] = False  # the prefill sets this slot's decode state on device
            admitted.append(req)
        return admitted

    def plan_prefill(self, reqs: list[Request]) -> list[tuple[list[Request], int]]:
        """``(requests, padded length)`` of each prefill call for ``reqs``: grouped by reuse
        wave (a later wave copies a prefix that an earlier one writes, so waves go in
        order) and bucketed new length, at most ``max_slots`` rows a call."""
        cfg = self.config
        groups: dict[tuple[int, int], list[Request]] = {}
        for req in reqs:
            n_new = len(req.prompt) - req.cached
            key = (req.grant.wave, bucket(n_new, cfg.length_buckets()))
            groups.setdefault(key, []).append(req)
        return [
            (group[start : start + cfg.max_slots], length)
            for (_, length), group in sorted(groups.items())
            for start in range(0, len(group), cfg.max_slots)
        ]

    def prefill_batch(self, group: list[Request], length: int) -> PrefillBatch:
        """The host arrays of one prefill call: each request's new tokens, positions, slot,
        prefix copy, sampling and device budget (rows bucketed); counts the tokens and
        marks each request with one pending token."""
        cfg = self.config
        paged = self.paged
        batch = PrefillBatch.host(
            bucket(len(group), cfg.row_buckets()),
            length,
            num_slots=cfg.max_slots,
            max_seq_len=cfg.max_seq_len,
            **({} if paged is None else paged.batch_shape),
        )
        for i, req in enumerate(group):
            new = req.prompt[req.cached :]
            batch.ids[i, : len(new)] = new
            batch.positions[i, : len(new)] = np.arange(req.cached, len(req.prompt))
            batch.slots[i] = req.slot
            batch.last_index[i] = len(new) - 1
            batch.next_position[i] = len(req.prompt)
            batch.keys[i] = req.key
            if paged is not None:
                paged.fill_prefill_row(batch, i, req.slot, req.block_copy)
            elif req.grant.copies:
                batch.copy_from[i], batch.copy_len[i] = req.grant.source, req.cached
            s = req.sampling
            batch.sampling.set_row(i, s.temperature, s.top_k, s.top_p, s.stop_token_ids)
            batch.budget[i] = req.max_new - 1  # the device stops the slot when it is spent
            self.counters["prefill_tokens"] += len(new)
            self.counters["cached_tokens"] += req.cached
            req.pending += 1
        return batch
