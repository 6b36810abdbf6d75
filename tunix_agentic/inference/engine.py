"""The in-process JAX inference engine: token-in/token-out with continuous batching.

A fixed set of slots shares one KV cache on device. A scheduler thread admits
waiting requests into free slots between decode chunks, prefills them together
(shapes bucketed by row count and length, so a new prompt length does not
recompile), then runs one jitted chunk of ``decode_steps`` decode steps over all
slots (a ``lax.scan``; no Python per token).

Host work overlaps device work: calls are dispatched asynchronously and the
next decode chunk is queued *before* the host collects the previous one,
so collecting tokens, finishing requests and admitting new ones overlap with
the device's work. The per-slot decode state (last token, position, PRNG key)
lives on the device and is threaded through prefill and decode calls; the host
only says which slots stop. A chunk queued ahead still decodes slots whose
request ended in the chunk before it; those tokens are discarded (their cache
writes lie beyond anything kept).

The scheduler runs on its own thread, not on the callers' event loop: when a
chunk completes it dispatches the next at once, whatever the agents' coroutines
are doing (a busy event loop used to delay it by a whole chunk or more). Callers
on any event loop submit through a queue; finished requests are handed back to
each caller's loop in one batch per scheduler iteration.

Sessions: a request may carry ``session_id``. When that request ends, its slot
is *parked* with its cache; if the session's next prompt extends what is
cached, only the new tokens are prefilled. Parked slots are evicted LRU when a
new request needs room. Weight updates swap the parameters between chunks
without draining; each generated token is tagged with the version that made it.
A parked cache made by an older version is dropped (recomputed) by default, so
every token is sampled from one coherent policy per chunk.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
import weakref
import zlib
from collections import OrderedDict, deque
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_agentic.inference.base import EngineError, PromptTooLongError, TokenOutput
from tunix_agentic.inference.sampling import SamplingParams, sample, split_keys
from tunix_agentic.models.transformer import ModelConfig, Transformer, init_cache

_log = logging.getLogger(__name__)
_IDLE_EXIT_S = 2.0  # the scheduler thread ends after this long with nothing to do


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Memory and batching limits of one engine."""

    max_slots: int = 32
    max_seq_len: int = 256
    decode_steps: int = 8
    min_prefill_len: int = 16
    session_reuse: bool = True
    reuse_kv_across_versions: bool = False
    # Queue the next decode chunk before collecting the last one, so host work overlaps the
    # device's (a queued chunk may decode slots whose request just ended: wasted rows).
    overlap: bool = True
    # Trainer: compile every prefill shape and the decode chunk on a second thread at start
    # (beside the SFT warm start) instead of when each shape is first met mid-rollout.
    warmup: bool = True
    seed: int = 0

    def __post_init__(self):
        for name in ("max_slots", "max_seq_len", "decode_steps", "min_prefill_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")

    def length_buckets(self) -> list[int]:
        out, n = [], self.min_prefill_len
        while n < self.max_seq_len:
            out.append(n)
            n *= 2
        return out + [self.max_seq_len]

    def row_buckets(self) -> list[int]:
        out, n = [], 1
        while n < self.max_slots:
            out.append(n)
            n *= 2
        return out + [self.max_slots]


def _commit(params: Any) -> Any:
    """Place every array explicitly where it already lives (committed arrays)."""
    return jax.tree.map(
        lambda x: jax.device_put(x, x.sharding) if isinstance(x, jax.Array) else x, params
    )


def _bucket(n: int, buckets: list[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


@dataclasses.dataclass
class _Request:
    rid: str
    prompt: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop  # the caller's: the result is handed over there
    submitted: float
    key: np.ndarray
    max_new: int = 0
    slot: int = -1
    cached: int = 0
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    aborted: bool = False
    pending: int = 0  # tokens dispatched to the device for this request, not yet collected


@dataclasses.dataclass
class _Op:
    """A prefill or decode call dispatched to the device, waiting to be collected."""

    kind: str  # "prefill" | "decode"
    outputs: tuple[jax.Array, jax.Array]  # (tokens, logprobs)
    owners: list[tuple[int, _Request]]  # prefill: (row, request); decode: (slot, request)
    version: int
    dispatched: float
    # (done time, host arrays): a waiter thread blocks on each op as soon as it is dispatched,
    # so completion times are taken when they happen, not when the scheduler gets round to it.
    waiter: concurrent.futures.Future | None = None


def _wait(outputs: tuple[jax.Array, ...]) -> tuple[float, tuple[np.ndarray, ...]]:
    """Block until the device has computed ``outputs``; returns (when, host copies)."""
    jax.block_until_ready(outputs)
    done = time.perf_counter()
    return done, tuple(np.asarray(x) for x in outputs)


@dataclasses.dataclass
class _Parked:
    session_id: str
    ids: list[int]  # tokens whose KV is valid in the slot, in order from position 0
    version: int


class JaxEngine:
    """Async token-in/token-out engine over a :class:`Transformer`.

    ``await generate(ids, sampling)`` returns a :class:`TokenOutput`. Safe to
    call from many coroutines of one event loop at once; that is the point.
    """

    def __init__(
        self, model: Transformer, config: EngineConfig = EngineConfig(), *, version: int = 0
    ):
        self.config = config
        self.model_config: ModelConfig = model.cfg
        self._graphdef, params = nnx.split(model, nnx.Param)
        self._params = _commit(params)
        self.version = version
        self._pending_params: tuple[Any, int] | None = None
        # Committed like every later cache (the outputs of donated calls), so the first
        # prefill and decode compile once, not once for a fresh cache and again after.
        self._cache = _commit(init_cache(self.model_config, config.max_slots, config.max_seq_len))
        s = config.max_slots
        self._carry = self._fresh_carry()  # on device: (last token, next position, key) per slot
        self._stop = np.zeros(s, bool)  # slots to deactivate at the next decode dispatch
        self._temp = np.ones(s, np.float32)
        self._top_k = np.zeros(s, np.int32)
        self._top_p = np.ones(s, np.float32)
        self._active: dict[int, _Request] = {}
        self._parked: OrderedDict[int, _Parked] = OrderedDict()  # LRU order: oldest first
        self._free: list[int] = list(range(s))
        self._queue: deque[_Request] = deque()
        self._by_rid: dict[str, _Request] = {}
        self._rid_counter = itertools.count()
        # Callers (any event loop) hand requests to the scheduler thread through the inbox;
        # results go back to each caller's loop in one batch per scheduler iteration.
        self._staged: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        self._inbox: deque[_Request] = deque()
        self._outbox: list[tuple[_Request, TokenOutput | BaseException]] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._exit_hook = False
        self._closed = False
        self._failure: str | None = None
        self._traces = {"prefill": 0, "decode": 0}
        self.stats = {
            "decode_chunks": 0,
            "prefill_calls": 0,
            "prefill_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            # Every second of the scheduler's life falls in one of three buckets:
            "busy_s": 0.0,  # inside jitted prefill/decode calls
            "sched_gap_s": 0.0,  # work was waiting, but no call was running (host-side cost)
            "idle_s": 0.0,  # nothing to do: no request active or queued
            # Of busy_s: decode chunks queued ahead whose every request had ended (overlap).
            "void_chunks": 0,
            "void_s": 0.0,
        }
        self._idle_since: float | None = None
        self._idle_spans: list[tuple[float, float]] = []  # idle periods since the last device op
        self._device_done_at = 0.0  # when the device finished its last op
        self._prefill_fn = jax.jit(self._prefill_impl, donate_argnums=(1, 2))
        self._decode_fn = jax.jit(self._decode_impl, donate_argnums=(1, 2))
        # What the device-side arguments look like (shapes, dtypes, placement): all warmup()
        # needs, taken now so it never touches arrays the scheduler may be donating.
        self._device_specs = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
            (self._params, self._cache, self._carry),
        )

    # ----------------------------------------------------------------- jitted
    def _prefill_impl(
        self, params, cache, carry, ids, pos, rows, last_idx, next_pos, keys, temp, top_k, top_p
    ):
        self._traces["prefill"] += 1  # runs only while tracing
        model = nnx.merge(self._graphdef, params)
        logits, cache = model(ids, pos, cache, rows, logits_at=last_idx)
        keys, use = split_keys(keys)
        tokens, logprobs = sample(logits, use, temp, top_k, top_p)
        # The admitted slots' decode state, set on device: the next chunk continues from it.
        c_tokens, c_pos, c_keys = carry
        carry = (
            c_tokens.at[rows].set(tokens, mode="drop"),
            c_pos.at[rows].set(next_pos, mode="drop"),
            c_keys.at[rows].set(keys, mode="drop"),
        )
        return cache, carry, tokens, logprobs

    def _decode_impl(self, params, cache, carry, stop, temp, top_k, top_p):
        self._traces["decode"] += 1
        model = nnx.merge(self._graphdef, params)
        limit = self.config.max_seq_len
        tokens, pos, keys = carry
        pos = jnp.where(stop, limit, pos)  # a stopped slot's writes fall off the cache

        def step(carry, _):
            cache, tokens, pos, keys = carry
            logits, cache = model(tokens[:, None], pos[:, None], cache)
            keys, use = split_keys(keys)
            new_tokens, logprobs = sample(logits[:, 0], use, temp, top_k, top_p)
            pos = jnp.minimum(pos + 1, limit)
            return (cache, new_tokens, pos, keys), (new_tokens, logprobs)

        (cache, tokens, pos, keys), (out_tokens, out_logprobs) = jax.lax.scan(
            step, (cache, tokens, pos, keys), None, length=self.config.decode_steps
        )
        return cache, (tokens, pos, keys), out_tokens, out_logprobs

    def _fresh_carry(self):
        s = self.config.max_slots
        return _commit(
            (
                jnp.zeros(s, jnp.int32),
                jnp.full(s, self.config.max_seq_len, jnp.int32),
                jnp.zeros((s, 2), jnp.uint32),
            )
        )

    # ------------------------------------------------------------- public API
    def warmup(self) -> dict[str, float]:
        """Compile every prefill shape (row bucket x length bucket) and the decode chunk now.

        Ahead-of-time, from shapes alone: it reads no engine state, so it may run on
        another thread while the engine serves, or while the caller does other work (the
        trainer runs it beside the SFT warm start). A request whose shape was compiled
        here starts without a compile pause. Returns the shapes compiled and the seconds.
        """
        t = time.perf_counter()
        cfg = self.config
        n = 0
        for length in cfg.length_buckets():
            for rows in cfg.row_buckets():
                i32 = np.zeros(rows, np.int32)
                self._prefill_fn.lower(
                    *self._device_specs,
                    np.zeros((rows, length), np.int32),  # ids
                    np.zeros((rows, length), np.int32),  # positions
                    i32,  # rows
                    i32,  # last index
                    i32,  # next position
                    np.zeros((rows, 2), np.uint32),  # keys
                    np.ones(rows, np.float32),  # temperature
                    i32,  # top_k
                    np.ones(rows, np.float32),  # top_p
                ).compile()
                n += 1
        s = cfg.max_slots
        self._decode_fn.lower(
            *self._device_specs,
            np.zeros(s, bool),  # stop
            np.ones(s, np.float32),  # temperature
            np.zeros(s, np.int32),  # top_k
            np.ones(s, np.float32),  # top_p
        ).compile()
        return {"shapes": n + 1, "seconds": time.perf_counter() - t}

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
    ) -> TokenOutput:
        """Generate from ``prompt_ids``; cancelling the caller aborts the request."""
        if self._closed:
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
        rid = request_id or f"req-{next(self._rid_counter)}"
        if rid in self._by_rid:
            raise ValueError(f"request id {rid!r} is already in flight")
        seed = (
            sampling.seed
            if sampling.seed is not None
            else zlib.crc32(f"{self.config.seed}/{rid}".encode())
        )
        loop = asyncio.get_running_loop()
        req = _Request(
            rid=rid,
            prompt=prompt,
            sampling=sampling,
            session_id=session_id,
            future=loop.create_future(),
            loop=loop,
            submitted=time.perf_counter(),
            key=np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32),
            max_new=min(sampling.max_new_tokens, self.config.max_seq_len - len(prompt)),
        )
        self._by_rid[rid] = req
        self._stage(req)
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            self.abort(rid)
            raise

    def abort(self, request_id: str) -> bool:
        """Abort a request: it returns what it has with finish_reason 'abort'."""
        req = self._by_rid.get(request_id)
        if req is None:
            return False
        req.aborted = True  # the scheduler finishes it at its next iteration
        self._wake.set()
        return True

    def update_weights(self, params: Any, version: int) -> None:
        """Swap in new parameters at the next chunk boundary; in-flight requests continue."""
        leaves_new = jax.tree_util.tree_leaves_with_path(params)
        leaves_old = jax.tree.leaves(self._params)
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
        # Committed like the current params, so the swap never triggers a silent recompile.
        self._pending_params = (_commit(params), int(version))
        self._ensure_thread()  # applied at once when idle, at the next chunk boundary if not
        self._wake.set()

    def health(self) -> dict[str, Any]:
        return {
            "ok": not self._closed,
            "version": self.version,
            "slots": self.config.max_slots,
            "active": len(self._active),
            "parked": len(self._parked),
            "queued": len(self._queue) + len(self._inbox),
            **self.stats,
            "compiles": dict(self.compiles),
            **({"error": self._failure} if self._failure else {}),
        }

    def clock(self) -> dict[str, float]:
        """Busy, host-gap and idle seconds so far, the idle period under way included.

        Differences of two readings split the wall time between them.
        """
        idle = self.stats["idle_s"]
        since = self._idle_since
        if since is not None:
            idle += time.perf_counter() - since
        return {
            "busy_s": self.stats["busy_s"],
            "sched_gap_s": self.stats["sched_gap_s"],
            "idle_s": idle,
        }

    @property
    def compiles(self) -> dict[str, int]:
        """Executables compiled so far for prefill and decode (each shape and placement counts)."""

        def count(fn, name):
            try:
                return max(fn._cache_size(), self._traces[name])
            except AttributeError:  # a JAX without the executable count: traces, a lower bound
                return self._traces[name]

        return {
            "prefill": count(self._prefill_fn, "prefill"),
            "decode": count(self._decode_fn, "decode"),
        }

    @property
    def params(self) -> Any:
        """The parameters in use (or about to be, if an update is pending)."""
        pending = self._pending_params
        return pending[0] if pending is not None else self._params

    @property
    def pending_version(self) -> int | None:
        pending = self._pending_params
        return pending[1] if pending is not None else None

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet finished (queued or decoding)."""
        return len(self._by_rid)

    async def close(self) -> None:
        """Abort what is in flight (callers get finish_reason 'abort') and stop the scheduler."""
        self._shutdown()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            await asyncio.to_thread(thread.join, 30)

    def _stage(self, req: _Request) -> None:
        # Requests made in one pass of the caller's loop (a gather of many episodes) reach the
        # scheduler together, so they are admitted and prefilled as one batch.
        staged = self._staged.get(req.loop)
        if staged is None:
            staged = self._staged[req.loop] = []
            req.loop.call_soon(self._submit_staged, req.loop)
        staged.append(req)

    def _submit_staged(self, loop: asyncio.AbstractEventLoop) -> None:
        reqs = self._staged.pop(loop, [])
        self._inbox.extend(reqs)
        if self._closed:  # close() ran meanwhile: take them back unless the scheduler has them
            error = self._closed_error()
            for req in reqs:
                try:
                    self._inbox.remove(req)
                except ValueError:
                    continue  # the scheduler took it and aborts it
                self._by_rid.pop(req.rid, None)
                if not req.future.done():
                    req.future.set_exception(error)
            return
        self._ensure_thread()
        self._wake.set()

    def _shutdown(self) -> None:
        self._closed = True
        for req in list(self._by_rid.values()):
            req.aborted = True
        self._wake.set()

    # -------------------------------------------------------------- scheduler
    def _ensure_thread(self) -> None:
        with self._thread_lock:
            if self._thread is not None or (self._closed and not self._by_rid):
                return
            # One waiter thread per scheduler thread: it blocks on each dispatched op in turn.
            waiter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jax-engine-wait")
            self._thread = threading.Thread(
                target=self._run, args=(waiter,), name="jax-engine-scheduler", daemon=True
            )
            self._thread.start()
            if not self._exit_hook:
                # An engine never closed must not leave its thread mid-call at process exit.
                atexit.register(_stop_at_exit, weakref.ref(self))
                self._exit_hook = True

    def _exit_if_idle(self) -> bool:
        """After a while with nothing to do the scheduler thread ends (a later request starts
        another), so an engine no one closed can still be garbage-collected."""
        with self._thread_lock:
            if self._inbox or self._wake.is_set():
                return False
            self._thread = None
            return True

    def _closed_error(self) -> EngineError:
        failed = f" (scheduler failed: {self._failure})" if self._failure else ""
        return EngineError(f"engine is closed{failed}")

    # ---------------------------------------------------- time accounting
    def _work_arrived(self) -> None:
        """End the idle period when the first waiting request was submitted (or now)."""
        since = self._idle_since
        if since is not None:
            try:
                at = max(self._inbox[0].submitted, since)
            except IndexError:  # woken by a weight update or close(), not a request
                at = time.perf_counter()
            self.stats["idle_s"] += at - since
            self._idle_spans.append((since, at))
            self._idle_since = None

    def _account(self, op: _Op, done: float) -> float:
        """Split the time up to ``done`` into device busy, host gap and (already counted) idle."""
        free_from, free_to = self._device_done_at, op.dispatched
        if free_to > free_from:  # the device had nothing queued in between
            idle = sum(
                max(0.0, min(end, free_to) - max(start, free_from))
                for start, end in self._idle_spans
            )
            self.stats["sched_gap_s"] += max(0.0, free_to - free_from - idle)
        self._idle_spans = [span for span in self._idle_spans if span[1] > free_to]
        busy = max(0.0, done - max(free_from, free_to))
        self.stats["busy_s"] += busy
        self._device_done_at = done
        return busy

    # -------------------------------------------------------------- scheduler
    def _run(self, waiter: concurrent.futures.ThreadPoolExecutor) -> None:
        """The scheduler thread: admit, dispatch, collect, until closed (or idle a while)."""
        try:
            self._schedule(waiter)
        except BaseException as exc:  # a failed device call must not strand any caller
            self._failure = f"{type(exc).__name__}: {exc}"
            self._closed = True
            error = EngineError(f"engine scheduler failed: {self._failure}")
            for req in list(self._by_rid.values()):
                self._by_rid.pop(req.rid, None)
                self._deliver(req, error)
            self._flush()
            _log.exception("engine scheduler failed; every open request got an EngineError")
        finally:
            waiter.shutdown(wait=False)

    def _schedule(self, waiter: concurrent.futures.ThreadPoolExecutor) -> None:
        self._work_arrived()  # a new thread (after an idle exit) ends that idle period
        outstanding: deque[_Op] = deque()  # dispatched to the device, not yet collected
        # Decode chunks the device may hold at once: one running and one queued behind it, so
        # the host collects one chunk while the next computes (1 = lockstep).
        depth = 2 if self.config.overlap else 1
        self._device_done_at = time.perf_counter()
        while True:
            self._wake.clear()  # before looking for work: a later set() is never missed
            self._take_inbox()
            self._apply_pending_weights()
            self._drop_aborted()
            if self._closed and not self._active and not outstanding:
                self._flush()
                return
            admitted = self._admit()
            new = self._dispatch_prefill(admitted) if admitted else []
            decodes = sum(op.kind == "decode" for op in outstanding)
            if decodes < depth and any(
                len(r.tokens) + r.pending < r.max_new for r in self._active.values()
            ):
                # (Not when every active request reaches its length limit within what is
                # already queued: a chunk past that would be thrown away.)
                new.append(self._dispatch_decode())
            for op in new:
                op.waiter = waiter.submit(_wait, op.outputs)
            outstanding.extend(new)
            self._flush()
            if outstanding:
                # Collect the oldest op; lockstep collects all before dispatching again.
                for _ in range(len(outstanding) if depth == 1 else 1):
                    op = outstanding.popleft()
                    done, arrays = op.waiter.result()
                    self._collect(op, arrays, self._account(op, done))
                continue
            if not self._active and not self._queue and self._pending_params is None:
                self._idle_since = time.perf_counter()
                if not self._wake.wait(_IDLE_EXIT_S) and self._exit_if_idle():
                    return
                self._work_arrived()

    def _take_inbox(self) -> None:
        while self._inbox:
            self._queue.append(self._inbox.popleft())

    def _apply_pending_weights(self) -> None:
        if self._pending_params is None:
            return
        params, version = self._pending_params
        self._pending_params = None
        self._params = params
        self.version = version
        if not self.config.reuse_kv_across_versions:
            for slot, parked in list(self._parked.items()):
                if parked.version != version:
                    del self._parked[slot]
                    self._free.append(slot)

    def _drop_aborted(self) -> None:
        closing = self._closed  # a request that raced with close() is aborted too
        for slot, req in list(self._active.items()):
            if req.aborted or closing:
                self._release(slot, req, park=False)
                self._finish(req, "abort")
        for req in [r for r in self._queue if r.aborted or closing]:
            self._queue.remove(req)
            self._finish(req, "abort")

    def _admit(self) -> list[_Request]:
        admitted = []
        while self._queue:
            req = self._queue[0]
            slot, cached = self._find_slot(req)
            if slot is None:
                break
            self._queue.popleft()
            req.slot, req.cached = slot, cached
            self._active[slot] = req
            s = req.sampling
            self._temp[slot] = s.temperature
            self._top_k[slot] = s.top_k
            self._top_p[slot] = s.top_p
            self._stop[slot] = False  # the prefill sets this slot's decode state on device
            admitted.append(req)
        return admitted

    def _find_slot(self, req: _Request) -> tuple[int | None, int]:
        if self.config.session_reuse and req.session_id is not None:
            for slot, parked in self._parked.items():
                if parked.session_id != req.session_id:
                    continue
                del self._parked[slot]
                n = len(parked.ids)
                if n < len(req.prompt) and req.prompt[:n] == parked.ids:
                    return slot, n
                return slot, 0  # same session, diverged history: reuse the slot, recompute
        if self._free:
            return self._free.pop(), 0
        if self._parked:
            slot, _ = self._parked.popitem(last=False)  # evict least recently used
            return slot, 0
        return None, 0

    def _dispatch_prefill(self, reqs: list[_Request]) -> list[_Op]:
        cfg = self.config
        groups: dict[int, list[_Request]] = {}
        for req in reqs:
            n_new = len(req.prompt) - req.cached
            groups.setdefault(_bucket(n_new, cfg.length_buckets()), []).append(req)
        return [
            self._prefill_group(group[start : start + cfg.max_slots], length)
            for length, group in groups.items()
            for start in range(0, len(group), cfg.max_slots)
        ]

    def _prefill_group(self, group: list[_Request], length: int) -> _Op:
        cfg = self.config
        rows_n = _bucket(len(group), cfg.row_buckets())
        ids = np.zeros((rows_n, length), np.int32)
        pos = np.full((rows_n, length), cfg.max_seq_len, np.int32)  # padding: dropped writes
        rows = np.full(rows_n, cfg.max_slots, np.int32)  # padding rows: dropped
        last_idx = np.zeros(rows_n, np.int32)
        next_pos = np.zeros(rows_n, np.int32)
        keys = np.zeros((rows_n, 2), np.uint32)
        temp = np.ones(rows_n, np.float32)
        top_k = np.zeros(rows_n, np.int32)
        top_p = np.ones(rows_n, np.float32)
        for i, req in enumerate(group):
            new = req.prompt[req.cached :]
            ids[i, : len(new)] = new
            pos[i, : len(new)] = np.arange(req.cached, len(req.prompt))
            rows[i] = req.slot
            last_idx[i] = len(new) - 1
            next_pos[i] = len(req.prompt)
            keys[i], temp[i], top_k[i], top_p[i] = (
                req.key,
                req.sampling.temperature,
                req.sampling.top_k,
                req.sampling.top_p,
            )
            self.stats["prefill_tokens"] += len(new)
            self.stats["cached_tokens"] += req.cached
            req.pending += 1
        self._cache, self._carry, tokens, logprobs = self._prefill_fn(
            self._params,
            self._cache,
            self._carry,
            ids,
            pos,
            rows,
            last_idx,
            next_pos,
            keys,
            temp,
            top_k,
            top_p,
        )
        # Enqueued (after any compile, which is host time): the device may start from here.
        dispatched = time.perf_counter()
        self.stats["prefill_calls"] += 1
        return _Op("prefill", (tokens, logprobs), list(enumerate(group)), self.version, dispatched)

    def _dispatch_decode(self) -> _Op:
        self._cache, self._carry, out_tokens, out_logprobs = self._decode_fn(
            self._params,
            self._cache,
            self._carry,
            self._stop.copy(),
            self._temp.copy(),
            self._top_k.copy(),
            self._top_p.copy(),
        )
        dispatched = time.perf_counter()
        self._stop[:] = False
        self.stats["decode_chunks"] += 1
        owners = list(self._active.items())
        for _, req in owners:
            req.pending += self.config.decode_steps
        return _Op("decode", (out_tokens, out_logprobs), owners, self.version, dispatched)

    def _collect(self, op: _Op, arrays: tuple[np.ndarray, ...], busy: float) -> None:
        """Hand an op's tokens to the requests that still own their slots."""
        tokens, logprobs = arrays
        if op.kind == "prefill":
            for i, req in op.owners:
                req.pending -= 1
                if self._active.get(req.slot) is req:
                    self._append(req, int(tokens[i]), float(logprobs[i]), op.version)
            return
        used = False
        for slot, req in op.owners:
            req.pending -= tokens.shape[0]
            if self._active.get(slot) is not req:
                continue  # ended (or was aborted) after this chunk was queued: its tokens are void
            used = True
            for k in range(tokens.shape[0]):
                if self._append(req, int(tokens[k, slot]), float(logprobs[k, slot]), op.version):
                    break
        if not used:
            self.stats["void_chunks"] += 1
            self.stats["void_s"] += busy

    def _append(self, req: _Request, token: int, logprob: float, version: int) -> bool:
        """Add one token; finish the request when it stops. Returns True when finished."""
        req.tokens.append(token)
        req.logprobs.append(logprob)
        req.versions.append(version)
        self.stats["generated_tokens"] += 1
        reason = None
        if token in req.sampling.stop_token_ids:
            reason = "stop"
        elif len(req.tokens) >= req.max_new:
            reason = "length"
        if reason is None:
            return False
        self._release(req.slot, req, park=True)
        self._finish(req, reason)
        return True

    def _release(self, slot: int, req: _Request, *, park: bool) -> None:
        self._active.pop(slot, None)
        self._stop[slot] = True  # its decoding stops at the next chunk
        if park and self.config.session_reuse and req.session_id is not None:
            # The last sampled token was never fed through the model: its KV is not cached.
            ids = req.prompt + req.tokens[:-1]
            self._parked[slot] = _Parked(
                req.session_id, ids, req.versions[-1] if req.versions else self.version
            )
        else:
            self._free.append(slot)

    def _finish(self, req: _Request, reason: str) -> None:
        self._by_rid.pop(req.rid, None)
        matched = req.tokens[-1] if reason == "stop" else None
        self._deliver(
            req,
            TokenOutput(
                token_ids=list(req.tokens),
                logprobs=list(req.logprobs),
                finish_reason=reason,
                matched_stop=matched,
                versions=list(req.versions),
                prompt_tokens=len(req.prompt),
                cached_tokens=req.cached,
                latency_s=time.perf_counter() - req.submitted,
            ),
        )

    def _deliver(self, req: _Request, result: TokenOutput | BaseException) -> None:
        self._outbox.append((req, result))

    def _flush(self) -> None:
        """Hand finished requests to their callers: one call into each caller's loop."""
        if not self._outbox:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for req, result in self._outbox:
            by_loop.setdefault(req.loop, []).append((req.future, result))
        self._outbox = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # that loop is closed: no one is waiting for these
                pass


def _resolve(items: list[tuple[asyncio.Future, TokenOutput | BaseException]]) -> None:
    for future, result in items:
        if future.done():  # the caller was cancelled
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


def _stop_at_exit(ref: weakref.ref) -> None:
    engine = ref()
    if engine is not None and engine._thread is not None:
        engine._shutdown()
        engine._thread.join(timeout=10)
