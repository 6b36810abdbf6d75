"""The engine's scheduler thread: it owns every piece of mutable engine state.

Callers never touch that state. They put commands on a queue (:class:`Submit`,
:class:`Abort`, :class:`Weights`, :class:`Close`) and get their results back on
their own event loop through ``call_soon_threadsafe``, one batch per loop per
iteration. The thread:

1. takes the commands that arrived (new requests join the wait queue);
2. applies pending weights at this chunk boundary (no drain: in-flight
   requests continue under the new version);
3. admits waiting requests into free slots (:class:`~.slots.SlotTable`) and
   dispatches their prefill (rows and length bucketed, so shapes repeat);
4. queues the next decode chunk before collecting the previous one, so host
   work overlaps the device's (``overlap``; a chunk queued ahead may decode
   slots whose request just ended: those tokens are void, and the device ends
   a chunk once none of its slots is live); a chunk attends over the smallest
   window bucket that holds its live slots (:func:`chunk_window`);
5. collects the oldest call (a waiter thread blocks on each dispatched call,
   so completion times are exact for the :class:`~.clock.EngineClock`).

It ends after a while with nothing to do (the next command starts another),
so an engine nobody closed can be collected. A device call that raises fails
every open request with :class:`EngineError` and closes the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from tunix_agentic.compiles import CompileCounter
from tunix_agentic.inference.admission import Admission
from tunix_agentic.inference.base import EngineError, TokenOutput, WeightUpdate
from tunix_agentic.inference.clock import EngineClock
from tunix_agentic.inference.config import EngineConfig, bucket
from tunix_agentic.inference.device_step import (
    DecodeState,
    PrefillBatch,
    RowSampling,
    StepConfig,
    decode,
    prefill,
)
from tunix_agentic.inference.paged import (
    PagedKV,
    chunk_tables,
    keep_cached,
    kv_gauges,
    release_forgotten,
)
from tunix_agentic.inference.request import Request
from tunix_agentic.inference.slots import Parked, SlotTable

_log = logging.getLogger(__name__)
IDLE_EXIT_S = 2.0  # the thread ends after this long with nothing to do


def commit(tree: Any) -> Any:
    """Place every array explicitly where it already lives (committed arrays), so jit sees
    one placement for the first call's inputs and every later (donated) output's."""
    return jax.tree.map(
        lambda x: jax.device_put(x, x.sharding) if isinstance(x, jax.Array) else x, tree
    )


# ---------------------------------------------------------------- commands
@dataclasses.dataclass(frozen=True)
class Submit:
    requests: list[Request]


@dataclasses.dataclass(frozen=True)
class Abort:
    request: Request  # submitted, or still staged on its caller's loop


@dataclasses.dataclass(frozen=True)
class Weights:
    params: Any
    version: int
    update: WeightUpdate  # resolved when applied (or failed if the engine stops first)


@dataclasses.dataclass(frozen=True)
class Close:
    pass


Command = Submit | Abort | Weights | Close


class OpenRequests:
    """Requests submitted and not yet answered, by id: the one structure both the callers
    (duplicate ids, abort, counts) and the scheduler (answering) use, behind a lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_rid: dict[str, Request] = {}

    def add(self, req: Request) -> None:
        with self._lock:
            if req.rid in self._by_rid:
                raise ValueError(f"request id {req.rid!r} is already in flight")
            self._by_rid[req.rid] = req

    def get(self, rid: str) -> Request | None:
        with self._lock:
            return self._by_rid.get(rid)

    def pop(self, rid: str) -> Request | None:
        with self._lock:
            return self._by_rid.pop(rid, None)

    def drain(self) -> list[Request]:
        with self._lock:
            reqs, self._by_rid = list(self._by_rid.values()), {}
        return reqs

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_rid)


@dataclasses.dataclass
class _Op:
    """A prefill or decode call dispatched to the device, waiting to be collected."""

    kind: str  # "prefill" | "decode"
    outputs: tuple[jax.Array, jax.Array]  # (tokens, logprobs)
    owners: list[tuple[int, Request]]  # prefill: (row, request); decode: (slot, request)
    version: int
    dispatched: float
    waiter: concurrent.futures.Future | None = None  # -> (done time, host arrays)


def jit_decode(step: StepConfig) -> Any:
    """The jitted :func:`~.device_step.decode`: cache and state donated, the window
    (argument 6 after ``step``) static."""
    return jax.jit(functools.partial(decode, step), donate_argnums=(1, 2), static_argnums=6)


def chunk_window(active: dict[int, Request], config: EngineConfig) -> int:
    """The decode window of the next chunk: the smallest of ``config.window_buckets()``
    that holds every position a live slot may attend to in it. A request fed its token
    at ``prompt + generated - 1`` (generated counting tokens dispatched and not yet
    collected) reads positions up to ``decode_steps - 1`` further, and never past
    ``prompt + max_new - 1`` (its device budget stops it there). Slots not active are
    stopped (their writes are dropped), so they need no room."""
    need = 1
    for req in active.values():
        n = len(req.prompt)
        fed = n + len(req.tokens) + req.pending - 1
        need = max(need, min(fed + config.decode_steps, n + req.max_new))
    return bucket(need, config.window_buckets())


def chunk_inputs(
    paged: PagedKV | None, active: dict[int, Request], config: EngineConfig
) -> tuple[np.ndarray, int]:
    """What a decode chunk takes besides the state: the block tables (paged: grown first to
    every position it may write; :func:`~.paged.chunk_tables`) and its window."""
    return chunk_tables(paged, active, config), chunk_window(active, config)


def _wait(outputs: tuple[jax.Array, ...]) -> tuple[float, tuple[np.ndarray, ...]]:
    """Block until the device has computed ``outputs``; returns (when, host copies)."""
    jax.block_until_ready(outputs)
    done = time.perf_counter()
    return done, tuple(np.asarray(x) for x in outputs)


class PendingWeights:
    """Weight updates waiting for the next chunk boundary. Only the newest is applied;
    those it replaced are resolved with it (the engine is then at, or past, their
    version)."""

    def __init__(self):
        self._pending: Weights | None = None
        self._superseded: list[Weights] = []  # replaced before applied: resolved with it

    @property
    def waiting(self) -> bool:
        return self._pending is not None

    def put(self, command: Weights) -> None:
        if self._pending is not None:
            self._superseded.append(self._pending)
        self._pending = command

    def take(self) -> list[Weights]:
        """The updates settled by applying the newest (empty: none waits): those it
        replaced, then it, last. The caller resolves them once the engine holds it."""
        if self._pending is None:
            return []
        taken = [*self._superseded, self._pending]
        self._superseded.clear()
        self._pending = None
        return taken

    def fail(self, error: EngineError, queued: list[Weights]) -> None:
        """Every update not applied (pending, superseded, and ``queued`` ones not taken
        yet) fails with ``error``."""
        unapplied = [*self._superseded, *([self._pending] if self._pending else []), *queued]
        self._superseded.clear()
        self._pending = None
        for command in unapplied:
            command.update.set_failed(error)


class Scheduler:
    """The thread that drives one engine's device state; see the module docstring."""

    def __init__(
        self,
        step: StepConfig,
        config: EngineConfig,
        params: Any,
        cache: Any,
        *,
        version: int,
        open_requests: OpenRequests,
    ):
        self.config = config
        s = config.max_slots
        self.params = params
        self.version = version
        self.cache = cache
        self.state = commit(DecodeState.fresh(s, config.max_seq_len))
        self.sampling = RowSampling.host(s)  # per slot, on the host
        self.stop = np.zeros(s, bool)  # slots to deactivate at the next decode dispatch
        self.slots: SlotTable[Request] = SlotTable(
            s, session_reuse=config.session_reuse, prefix_cache=config.prefix_cache
        )
        self.paged = PagedKV.of(config)  # block tables (None: dense, a slot's rows are its own)
        self.kv = kv_gauges(self.slots, self.paged, config)  # set each iteration, for stats
        self.clock = EngineClock()
        self.counters = {
            "decode_chunks": 0,
            "prefill_calls": 0,
            "prefill_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            # Of busy time: decode chunks queued ahead whose every request had ended.
            "void_chunks": 0,
            "void_s": 0.0,
            # Decode steps the device ran, and those run after every request of the chunk
            # had ended (the device stops a chunk once no slot is live, so these stay few).
            "decode_steps": 0,
            "void_decode_steps": 0,
        }
        self.open = open_requests
        self.admission = Admission(
            config, self.slots, self.paged, self.sampling, self.stop, self.counters
        )
        self.queue = self.admission.queue  # submitted, waiting for a slot
        self.failure: str | None = None
        self.closing = False
        # The jitted steps (``.lower`` for ahead-of-time compiles) and their calls, whose
        # compilations ``compiles`` counts.
        self.prefill_jit = jax.jit(functools.partial(prefill, step), donate_argnums=(1, 2))
        self.decode_jit = jit_decode(step)  # one executable per window bucket
        self.compiles = CompileCounter()
        self.prefill_fn = self.compiles.wrap("prefill", self.prefill_jit)
        self.decode_fn = self.compiles.wrap("decode", self.decode_jit)
        # Constrained requests (a grammar's mask per token): one step per call, compiled
        # only once such a request comes (``mask_words``: the bitmask's width).
        self.decode_one_fn = self.compiles.wrap(
            "decode", jit_decode(dataclasses.replace(step, decode_steps=1))
        )
        self.mask_words = 0
        self.weights = PendingWeights()
        self._outbox: list[tuple[Request, TokenOutput | BaseException]] = []
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()

    # ------------------------------------------------------ from callers
    def send(self, command: Command) -> None:
        """Hand a command to the thread (starting one if none runs). After a failure no
        thread starts again: weights sent then fail at once."""
        if self.failure is not None:
            if isinstance(command, Weights):
                command.update.set_failed(EngineError(f"engine scheduler failed: {self.failure}"))
            return
        self._commands.put(command)
        self._ensure_thread()
        self._wake.set()

    def join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _ensure_thread(self) -> None:
        with self._thread_lock:
            if self._thread is not None:
                return
            # One waiter thread per scheduler thread: it blocks on each dispatched op in turn.
            waiter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jax-engine-wait")
            self._thread = threading.Thread(
                target=self._run, args=(waiter,), name="jax-engine-scheduler", daemon=True
            )
            self._thread.start()

    def _exit_if_idle(self) -> bool:
        with self._thread_lock:
            if not self._commands.empty() or self._wake.is_set():
                return False
            self._thread = None
            return True

    # ------------------------------------------------------------ thread
    def _run(self, waiter: concurrent.futures.ThreadPoolExecutor) -> None:
        try:
            self._schedule(waiter)
        except BaseException as exc:  # a failed device call must not strand any caller
            self.failure = f"{type(exc).__name__}: {exc}"
            self.closing = True
            error = EngineError(f"engine scheduler failed: {self.failure}")
            for req in self.open.drain():
                self._outbox.append((req, error))
            self._flush()
            self._fail_weights(error)
            with self._thread_lock:
                self._thread = None
            _log.exception("engine scheduler failed; every open request got an EngineError")
        finally:
            waiter.shutdown(wait=False)

    def _fail_weights(self, error: EngineError) -> None:
        """Every weight update not applied (pending, superseded, still queued) fails."""
        queued = [c for c in self._queued() if isinstance(c, Weights)]
        self.weights.fail(error, queued)

    def _schedule(self, waiter: concurrent.futures.ThreadPoolExecutor) -> None:
        self.clock.start(time.perf_counter())
        outstanding: deque[_Op] = deque()  # dispatched to the device, not yet collected
        # Decode chunks the device may hold at once: one running and one queued behind it, so
        # the host collects one chunk while the next computes (1 = lockstep).
        depth = 2 if self.config.overlap else 1
        while True:
            self._wake.clear()  # before looking for work: a later set() is never missed
            self._take_commands()
            self._apply_pending_weights()
            self._drop_aborted()
            if self.closing and not self.slots.active and not outstanding:
                self._flush()
                with self._thread_lock:
                    self._thread = None
                return
            admitted = self.admission.admit(self.version)
            new = self._dispatch_prefill(admitted) if admitted else []
            decodes = sum(op.kind == "decode" for op in outstanding)
            # A grammar's next mask needs the last token: with a constrained request
            # live, decode only once everything dispatched is collected (lockstep).
            constrained = any(r.matcher is not None for r in self.slots.active.values())
            ready = not (outstanding or new) if constrained else decodes < depth
            if ready and any(
                len(r.tokens) + r.pending < r.max_new for r in self.slots.active.values()
            ):
                # (Not when every active request reaches its length limit within what is
                # already queued: a chunk past that would be thrown away.)
                new.append(self._dispatch_decode())
            for op in new:
                op.waiter = waiter.submit(_wait, op.outputs)
            outstanding.extend(new)
            # Before the callers hear of what ended (a caller reads them after its request).
            self.kv = kv_gauges(self.slots, self.paged, self.config)
            self._flush()
            if outstanding:
                # Collect the oldest op; lockstep collects all before dispatching again.
                for _ in range(len(outstanding) if depth == 1 else 1):
                    op = outstanding.popleft()
                    done, arrays = op.waiter.result()
                    self._collect(op, arrays, self.clock.account(op.dispatched, done, op.kind))
                    stream_fresh(op.owners)
                continue
            if not self.slots.active and not self.queue and not self.weights.waiting:
                if self.clock.idle_since is None:
                    self.clock.idle_from(time.perf_counter())
                if not self._wake.wait(IDLE_EXIT_S) and self._exit_if_idle():
                    return

    def _queued(self) -> Iterator[Command]:
        """Every command sent so far, taken off the queue in order."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _take_commands(self) -> None:
        for command in self._queued():
            if isinstance(command, Submit):
                # Idle ended when the first of these requests was submitted.
                self.clock.work_arrived(min(r.submitted for r in command.requests))
                self.queue.extend(command.requests)
                continue
            self.clock.work_arrived(time.perf_counter())
            if isinstance(command, Abort):
                command.request.aborted = True  # finished at this iteration, or when submitted
            elif isinstance(command, Weights):
                self.weights.put(command)
            elif isinstance(command, Close):
                self.closing = True

    def _apply_pending_weights(self) -> None:
        taken = self.weights.take()
        if not taken:
            return
        pending = taken[-1]
        self.params, self.version = pending.params, pending.version
        for done in taken:  # after the swap: a waiter reads the engine at their version
            done.update.set_applied()
        if not self.config.reuse_kv_across_versions:
            self.slots.drop_parked_except(self.version)
            release_forgotten(self.paged, self.slots)  # paged: their blocks go back

    def _drop_aborted(self) -> None:
        closing = self.closing  # a request that raced with close() is aborted too
        for slot, req in list(self.slots.active.items()):
            if req.aborted or closing:
                self._release(slot, req, park=False)
                self._finish(req, "abort")
        for req in [r for r in self.queue if r.aborted or closing]:
            self.queue.remove(req)
            self._finish(req, "abort")

    # ---------------------------------------------------------- dispatch
    def _dispatch_prefill(self, reqs: list[Request]) -> list[_Op]:
        """Prefill the admitted ``reqs``: one device call per batch of the admission's plan."""
        return [
            self._prefill(group, self.admission.prefill_batch(group, length))
            for group, length in self.admission.plan_prefill(reqs)
        ]

    def _masks(self, rows: list[tuple[int, Request]], count: int) -> np.ndarray:
        """The allowed-token bitmask of ``count`` rows (every token but a grammar's)."""
        masks = np.full((count, self.mask_words), -1, np.int32)
        for row, req in rows:
            req.fill_mask(masks, row)
        return masks

    def _prefill(self, group: list[Request], batch: PrefillBatch) -> _Op:
        if any(req.matcher is not None for req in group):
            masks = self._masks(list(enumerate(group)), batch.ids.shape[0])
            batch = batch.replace(sampling=batch.sampling.replace(allowed=masks))
        self.cache, self.state, tokens, logprobs = self.prefill_fn(
            self.params, self.cache, self.state, batch
        )
        # Enqueued (after any compile, which is host time): the device may start from here.
        dispatched = time.perf_counter()
        self.counters["prefill_calls"] += 1
        return _Op("prefill", (tokens, logprobs), list(enumerate(group)), self.version, dispatched)

    def _dispatch_decode(self) -> _Op:
        chunk = chunk_inputs(self.paged, self.slots.active, self.config)  # (tables, window)
        owners = list(self.slots.active.items())
        sampling, decode, steps = self.sampling.copy(), self.decode_fn, self.config.decode_steps
        if any(req.matcher is not None for _, req in owners):
            sampling = sampling.replace(allowed=self._masks(owners, len(self.stop)))
            decode, steps = self.decode_one_fn, 1
        self.cache, self.state, out_tokens, out_logprobs = decode(
            self.params, self.cache, self.state, self.stop.copy(), sampling, *chunk
        )
        dispatched = time.perf_counter()
        self.stop[:] = False
        self.counters["decode_chunks"] += 1
        for _, req in owners:
            req.pending += steps
        return _Op("decode", (out_tokens, out_logprobs), owners, self.version, dispatched)

    # ----------------------------------------------------------- collect
    def _collect(self, op: _Op, arrays: tuple[np.ndarray, ...], busy: float) -> None:
        """Hand an op's tokens to the requests that still own their slots."""
        tokens, logprobs = arrays
        if op.kind == "prefill":
            for i, req in op.owners:
                req.pending -= 1
                if self.slots.owner(req.slot) is req:
                    self._append(req, int(tokens[i]), float(logprobs[i]), op.version)
            return
        used = False
        ran = int((tokens >= 0).any(axis=1).sum())  # steps the device ran (-1: skipped)
        needed = 0
        for slot, req in op.owners:
            req.pending -= tokens.shape[0]
            if self.slots.owner(slot) is not req:
                continue  # ended (or was aborted) after this chunk was queued: its tokens are void
            used = True
            steps = ran  # a request still going used every step the device ran
            for k in range(ran):
                if self._append(req, int(tokens[k, slot]), float(logprobs[k, slot]), op.version):
                    steps = k + 1
                    break
            needed = max(needed, steps)
        self.counters["decode_steps"] += ran
        self.counters["void_decode_steps"] += ran - needed
        if not used:
            self.counters["void_chunks"] += 1
            self.counters["void_s"] += busy

    def _append(self, req: Request, token: int, logprob: float, version: int) -> bool:
        """Add one token; finish the request when it stops. Returns True when finished."""
        req.tokens.append(token)
        req.logprobs.append(logprob)
        req.versions.append(version)
        self.counters["generated_tokens"] += 1
        reason = None
        if token in req.sampling.stop_token_ids:
            reason = "stop"
        elif req.matcher is not None and (
            not req.matcher.accept(token) or req.matcher.terminated()
        ):
            reason = "stop"  # the grammar ended (or, never seen, refused what the mask let by)
        elif len(req.tokens) >= req.max_new:
            reason = "length"
        if reason is None:
            return False
        self._release(req.slot, req, park=True)
        self._finish(req, reason)
        return True

    def _release(self, slot: int, req: Request, *, park: bool) -> None:
        self.stop[slot] = True  # its decoding stops at the next chunk
        parked = None
        if park and req.session_id is not None:
            # The last sampled token was never fed through the model: its KV is not cached.
            parked = Parked(
                req.session_id,
                req.prompt + req.tokens[:-1],
                req.versions[-1] if req.versions else self.version,
            )
        self.slots.release(slot, parked)
        keep_cached(self.paged, self.slots, slot)  # paged: the blocks of what stays cached

    def _finish(self, req: Request, reason: str) -> None:
        self.open.pop(req.rid)
        self._outbox.append((req, req.output(reason)))

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
                loop.call_soon_threadsafe(resolve, items)
            except RuntimeError:  # that loop is closed: no one is waiting for these
                pass


def stream_fresh(owners: list[tuple[int, Request]]) -> None:
    """Post the tokens a streaming caller has not had to its loop (before it hears the
    request ended: :meth:`Scheduler._flush` comes later, and a loop runs callbacks in the
    order they are posted)."""
    for _, req in owners:
        if req.on_tokens is not None and len(req.tokens) > req.streamed:
            fresh, req.streamed = req.tokens[req.streamed :], len(req.tokens)
            try:
                req.loop.call_soon_threadsafe(req.on_tokens, fresh)
            except RuntimeError:  # that loop is closed: no one is reading
                req.on_tokens = None


def resolve(items: list[tuple[asyncio.Future, TokenOutput | BaseException]]) -> None:
    """On a caller's loop: settle each future (a cancelled caller's is skipped)."""
    for future, result in items:
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
