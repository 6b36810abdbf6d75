"""The in-process JAX inference engine: token-in/token-out with continuous batching.

A fixed set of slots shares one KV cache on device. A scheduler thread admits
waiting requests into free slots between decode chunks, prefills them together
(shapes bucketed by row count and length, so a new prompt length does not
recompile), then runs one jitted chunk of ``decode_steps`` decode steps over all
slots (a ``lax.scan``; no Python per token).

Host work overlaps device work: calls are dispatched asynchronously and the
next decode chunk is queued *before* the host collects the previous one,
so collecting tokens, finishing requests and admitting new ones overlap with
the device's work. The per-slot decode state (last token, position, PRNG key,
token budget) lives on the device and is threaded through prefill and decode
calls; the host only says which slots stop. A slot also stops on device when it
samples a stop id or spends its budget, and a chunk ends once no slot is live,
so a chunk queued ahead whose requests all ended in the chunk before it runs no
step (``stats``: ``decode_steps`` run, ``void_decode_steps`` run past every
request's end). A chunk's attention reads only the first ``window`` cache positions,
the smallest of a few buckets that holds its live slots to the chunk's end
(``EngineConfig.decode_window``), so short sequences do not pay for ``max_seq_len``.
The dense cache is stored in pieces cut at those windows (and every 512 positions:
:func:`~tunix_agentic.models.transformer.cache_chunks`), so a window reads whole arrays
instead of a sliced copy of every slot's keys and values.

The scheduler runs on its own thread, not on the callers' event loop: when a
chunk completes it dispatches the next at once, whatever the agents' coroutines
are doing. Callers on any event loop talk to it only through a command queue
(submit, abort, update weights, close); finished requests are handed back to
each caller's loop in one batch per scheduler iteration.

This module is the facade and its config; the rooms behind it are
:mod:`.device_step` (the pure jitted prefill and decode over typed state),
:mod:`.slots` (the slot table), :mod:`.scheduler` (the thread, which owns all
mutable state), :mod:`.clock` (busy / host-gap / idle accounting) and :mod:`.warmup`
(every shape compiled ahead of the requests).

Sessions: a request may carry ``session_id``. When that request ends, its slot
is *parked* with its cache; if the session's next prompt extends what is
cached, only the new tokens are prefilled. Parked slots are evicted LRU when a
new request needs room. Weight updates swap the parameters between chunks
without draining; each generated token is tagged with the version that made it.
A parked cache made by an older version is dropped (recomputed) by default, so
every token is sampled from one coherent policy per chunk.

Shared prefixes (``EngineConfig.prefix_cache``, on by default): every slot
remembers the prompt whose KV it holds, a freed slot until it is reused. A new
request starts from the longest prefix of its prompt held anywhere (a GRPO
group's G samples, episodes sharing a system prompt and tool schemas): those KV
rows are copied on device into its slot inside the prefill call, and only the
rest is prefilled. ``TokenOutput.cached_tokens`` says how many prompt tokens
were reused (``meta_info.cached_tokens`` on the wire, as SGLang reports it);
``stats["cached_tokens"]`` sums them. A weight update forgets every cached
prefix made by other weights (unless ``reuse_kv_across_versions``).

KV layout (``EngineConfig.kv_layout``): "dense" (the default) gives every slot
``max_seq_len`` rows; "paged" keeps one pool of fixed-size blocks per layer and
a block table per slot (:mod:`.paged`), so the KV held grows with the tokens
held, a shared prefix's full blocks are shared by reference count instead of
copied, and a request waits in the queue until its blocks are free. Outputs are
the same in both layouts.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import itertools
import time
import weakref
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from tunix_agentic.inference.base import (
    EngineError,
    PromptTooLongError,
    TokenCallback,
    TokenOutput,
    WeightUpdate,
)
from tunix_agentic.inference.config import EngineConfig
from tunix_agentic.inference.constraint import GrammarBook
from tunix_agentic.inference.device_step import StepConfig
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.inference.scheduler import (
    Abort,
    Close,
    OpenRequests,
    Request,
    Scheduler,
    Submit,
    Weights,
    commit,
)
from tunix_agentic.inference.warmup import Warmup
from tunix_agentic.models.transformer import (
    ModelConfig,
    Transformer,
    cache_chunks,
    init_cache,
    init_paged_cache,
    kernel_pages,
)
from tunix_agentic.sharding import (
    cache_sharding,
    make_mesh,
    replicated,
    reshard,
    shard_tree,
)


class JaxEngine:
    """Async token-in/token-out engine over a :class:`Transformer`.

    ``await generate(ids, sampling)`` returns a :class:`TokenOutput`. Callers on
    any event loop, any number at once (that is the point), from any thread.
    The engine is a facade over four rooms: the device step
    (:mod:`.device_step`), the slot table (:mod:`.slots`), the scheduler
    thread that owns all mutable state (:mod:`.scheduler`) and the clock
    (:mod:`.clock`).

    The engine keeps its own copy of the model's parameters, so a learner's
    donating train step on the same model never deletes the engine's arrays.
    ``update_weights`` takes ownership of the arrays it is given.

    ``mesh`` (default: from ``config.mesh``): serve from a sharded model (:mod:`tunix_agentic.sharding`: weights by its
    rules, the KV cache's kv-heads over ``tp``). Weights handed to ``update_weights`` are
    moved onto the engine's shardings, wherever the learner keeps them (a learner on
    other devices: disaggregated placement).
    """

    def __init__(
        self,
        model: Transformer,
        config: EngineConfig = EngineConfig(),
        *,
        version: int = 0,
        mesh: Mesh | None = None,
    ):
        self.config = config
        self.model_config: ModelConfig = model.cfg
        if mesh is None and not config.mesh.trivial:
            mesh = make_mesh(config.mesh)
        self.mesh = mesh
        graphdef, params = nnx.split(model, nnx.Param)
        # Its own copy: device_put to the same place does not copy, and a donating train step
        # on the model would otherwise delete the engine's parameters.
        params = jax.tree.map(jnp.copy, params)
        paged = config.kv_layout == "paged"
        if paged:  # per layer one pool of blocks (inference/paged.py), not a row per slot
            cache = init_paged_cache(self.model_config, config.num_kv_blocks, config.kv_block_size)
        else:
            # In pieces cut at the decode windows: a window reads whole arrays, no copy.
            chunks = cache_chunks(config.max_seq_len, config.window_buckets())
            cache = init_cache(self.model_config, config.max_slots, config.max_seq_len, chunks)
        if mesh is not None:
            params = shard_tree(params, mesh)
            pages = paged and kernel_pages(self.model_config)
            sharding = cache_sharding(mesh, self.model_config.num_kv_heads, pages=pages)
            cache = jax.device_put(cache, sharding)
        else:  # one device, the cache's (a model trained on a mesh is gathered onto it)
            params = jax.device_put(params, jax.tree.leaves(cache)[0].sharding)
        # Committed like every later cache (the outputs of donated calls), so the first
        # prefill and decode compile once, not once for a fresh cache and again after.
        cache = commit(cache)
        self._open = OpenRequests()
        self.grammars: GrammarBook | None = None  # constrained decoding: use_tokenizer
        self._scheduler = Scheduler(
            StepConfig(graphdef, config.max_seq_len, config.decode_steps, paged=paged),
            config,
            params,
            cache,
            version=version,
            open_requests=self._open,
        )
        if mesh is not None:  # the decode state beside the sharded weights and cache
            self._scheduler.state = jax.device_put(self._scheduler.state, replicated(mesh))
        self._latest: tuple[Any, int] = (params, version)  # the newest weights handed over
        self._latest_update = WeightUpdate.applied(version)
        self._rid_counter = itertools.count()
        # Requests made in one pass of a caller's loop reach the scheduler as one Submit.
        self._staged: dict[asyncio.AbstractEventLoop, list[Request]] = {}
        self._closed = False
        # An engine never closed must not leave its thread mid-call at process exit.
        atexit.register(_stop_at_exit, weakref.ref(self))
        # What the device-side arguments look like (shapes, dtypes, placement): all warmup()
        # needs, taken now so it never touches arrays the scheduler may be donating.
        self._device_specs = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            (params, cache, self._scheduler.state),
        )
        self._warmup = Warmup(config, self._scheduler, self._device_specs)
        if config.warmup:  # (None: whoever builds the engine decides; see EngineConfig)
            self._warmup.start()

    # ------------------------------------------------------------- public API
    def warmup(self) -> dict[str, float]:
        """Compile every prefill shape (row bucket x length bucket) and the decode chunk at
        every window bucket (``EngineConfig.window_buckets``) now (:mod:`.warmup`).

        Ahead-of-time, from shapes alone: it reads no engine state, so it may run on
        another thread while the engine serves, or while the caller does other work (the
        trainer runs it beside the SFT warm start). A request whose shape was compiled
        here starts without a compile pause. Returns the shapes compiled and the seconds.
        """
        return self._warmup.run()

    def start_warmup(self) -> concurrent.futures.Future:
        """Run :meth:`warmup` on a background thread (once per engine; ``EngineConfig.warmup:
        true`` starts it as the engine is built). Requests may be submitted meanwhile: a
        shape not compiled yet compiles when first met, as without warm-up. The future
        resolves with warmup's result; :meth:`close` stops it between two shapes."""
        return self._warmup.start()

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        """Generate from ``prompt_ids``; cancelling the caller aborts the request.
        ``on_tokens`` gets the ids as each decode chunk is collected."""
        if self.closed:
            raise self._closed_error()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids must not be empty")
        vocab = self.model_config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(prompt) >= self.config.max_seq_len:
            raise PromptTooLongError(
                f"prompt of {len(prompt)} tokens leaves no room within max_seq_len={self.config.max_seq_len}"
            )
        sampling.check_vocab(vocab)  # a value the device step cannot take fails this request only
        matcher = None
        if sampling.constraint is not None:
            if self.grammars is None:
                raise ValueError(
                    "constrained decoding needs the model's tokenizer: this engine was not "
                    "given one (JaxEngine.use_tokenizer; serve-engine with a Hugging Face "
                    "model directory)"
                )
            matcher = await self.grammars.matcher_async(sampling.constraint)  # ValueError if bad
            self._scheduler.mask_words = self.grammars.words
        rid = request_id or f"req-{next(self._rid_counter)}"
        seed = (
            sampling.seed
            if sampling.seed is not None
            else zlib.crc32(f"{self.config.seed}/{rid}".encode())
        )
        loop = asyncio.get_running_loop()
        req = Request(
            rid=rid,
            prompt=prompt,
            sampling=sampling,
            session_id=session_id,
            future=loop.create_future(),
            loop=loop,
            submitted=time.perf_counter(),
            key=np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32),
            max_new=min(sampling.max_new_tokens, self.config.max_seq_len - len(prompt)),
            matcher=matcher,
            on_tokens=on_tokens,
        )
        self._open.add(req)  # raises for an id already in flight
        self._stage(req)
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            self.abort(rid)
            raise

    def use_tokenizer(self, tokenizer: Any, stop_ids: tuple[int, ...] | None = None) -> None:
        """Enable constrained decoding (``SamplingParams.constraint``) with the model's
        tokenizer (``stop_ids``: where a complete grammar may end; default the tokenizer's):
        ``grammars`` (a :class:`~.constraint.GrammarBook`) reads its vocabulary when the
        first constrained request comes. The first tokenizer given stays: a later offer (a
        server or endpoint mounted on an engine the trainer equipped) changes nothing."""
        if self.grammars is None:
            self.grammars = GrammarBook(tokenizer, self.model_config.vocab_size, stop_ids)

    def abort(self, request_id: str) -> bool:
        """Abort a request: it returns what it has with finish_reason 'abort'."""
        req = self._open.get(request_id)
        if req is None:
            return False
        self._scheduler.send(Abort(req))
        return True

    def update_weights(self, params: Any, version: int) -> WeightUpdate:
        """Swap in new parameters at the next chunk boundary; in-flight requests continue.

        Returns a :class:`WeightUpdate` that resolves when the scheduler has applied them
        (an update superseded before that resolves with its successor); on a closed or
        failed engine it fails with :class:`EngineError`. A parameter tree that does not
        fit the model raises ``ValueError`` here and changes nothing.
        """
        leaves_new = jax.tree_util.tree_leaves_with_path(params)
        leaves_old = jax.tree.leaves(self._device_specs[0])
        if len(leaves_new) != len(leaves_old):
            raise ValueError(
                f"update_weights: parameter tree does not match the engine's model "
                f"({len(leaves_new)} arrays, the model has {len(leaves_old)})"
            )
        for (path, a), b in zip(leaves_new, leaves_old, strict=True):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(
                    f"update_weights: parameter tree does not match the engine's model at "
                    f"{jax.tree_util.keystr(path)}: {a.dtype}{list(a.shape)}, the model has "
                    f"{b.dtype}{list(b.shape)}"
                )
        # Placed (and committed) like the current params, so the swap never triggers a silent
        # recompile; from a learner on other devices this is the reshard.
        params = reshard(params, self._device_specs[0])
        self._latest = (params, int(version))
        if self.closed:  # kept as the pending weights: nothing will apply them
            update = WeightUpdate.failed(version, self._closed_error())
        else:
            update = WeightUpdate(version)
            self._scheduler.send(Weights(params, int(version), update))
            if self._scheduler.failure is not None:  # failed meanwhile: no thread will take it
                update.set_failed(self._closed_error())
        self._latest_update = update
        return update

    @property
    def version(self) -> int:
        """The weight version the engine generates with now."""
        return self._scheduler.version

    @property
    def closed(self) -> bool:
        return self._closed or self._scheduler.failure is not None

    @property
    def stats(self) -> dict[str, float]:
        """Counters of the work done, the clock's busy / host-gap / idle seconds, and the
        KV held now: ``kv_tokens_held`` (tokens whose KV is cached: in flight, parked, kept
        prefixes), ``kv_tokens_reserved`` (what the layout sets aside on device) and, paged,
        ``kv_blocks_used`` / ``kv_blocks_peak`` / ``kv_blocks_total``."""
        clock = self._scheduler.clock
        return {
            **self._scheduler.counters,
            **self._scheduler.kv,
            "busy_s": clock.busy_s,
            "sched_gap_s": clock.sched_gap_s,
            "idle_s": clock.idle_s,
        }

    def health(self) -> dict[str, Any]:
        sched = self._scheduler
        failure = sched.failure
        active = len(sched.slots.active)
        return {
            "ok": not self.closed,
            "version": self.version,
            "slots": self.config.max_slots,
            "active": active,
            "parked": len(sched.slots.parked),
            "queued": max(0, len(self._open) - active),
            **self.stats,
            "compiles": dict(self.compiles),
            **({"error": failure} if failure else {}),
        }

    async def check_health(self) -> bool:
        """In process there is nothing to probe: whether the engine is still open."""
        return not self.closed

    def clock(self) -> dict[str, float]:
        """Busy, host-gap and idle seconds so far, the idle period under way included.

        Differences of two readings split the wall time between them.
        """
        return self._scheduler.clock.reading()

    @property
    def compiles(self) -> dict[str, int]:
        """Executables compiled so far for prefill and decode (each shape and placement
        counts; warm-up's included), from JAX's compile events (:mod:`tunix_agentic.compiles`)."""
        return self._scheduler.compiles.counts

    @property
    def params(self) -> Any:
        """The parameters in use (or about to be, if an update is pending)."""
        return self._latest[0]

    @property
    def pending_version(self) -> int | None:
        """The version of weights handed over and not (or never to be) applied, if any."""
        update = self._latest_update
        if update.done() and update.future.exception() is None:
            return None
        return self._latest[1]

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet finished (queued or decoding)."""
        return len(self._open)

    async def close(self) -> None:
        """Abort what is in flight (callers get finish_reason 'abort') and stop the scheduler."""
        self._closed = True
        self._scheduler.send(Close())
        await asyncio.to_thread(self._scheduler.join, 30)
        await asyncio.to_thread(self._warmup.stop, 60)  # after the shape under way

    # ---------------------------------------------------------- hand-over
    def _stage(self, req: Request) -> None:
        # Requests made in one pass of the caller's loop (a gather of many episodes) reach the
        # scheduler together, so they are admitted and prefilled as one batch.
        staged = self._staged.get(req.loop)
        if staged is None:
            staged = self._staged[req.loop] = []
            req.loop.call_soon(self._submit_staged, req.loop)
        staged.append(req)

    def _submit_staged(self, loop: asyncio.AbstractEventLoop) -> None:
        reqs = self._staged.pop(loop, [])
        if self.closed:  # close() ran meanwhile: these never reach the scheduler
            error = self._closed_error()
            for req in reqs:
                self._open.pop(req.rid)
                if not req.future.done():
                    req.future.set_exception(error)
            return
        if reqs:
            self._scheduler.send(Submit(reqs))

    def _closed_error(self) -> EngineError:
        failure = self._scheduler.failure
        failed = f" (scheduler failed: {failure})" if failure else ""
        return EngineError(f"engine is closed{failed}")


def _stop_at_exit(ref: weakref.ref) -> None:
    engine = ref()
    if engine is None:
        return
    if engine._scheduler.running:
        engine._closed = True
        engine._scheduler.send(Close())
        engine._scheduler.join(10)
    engine._warmup.stop(30)  # no compile thread left mid-call at interpreter exit
