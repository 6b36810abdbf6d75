"""A run's timeline: a Chrome trace / Perfetto JSON of the learner, the engines and sampled episodes.

Every run writes ``RUN_DIR/trace/trace-NNN.json.gz``; open it at
https://ui.perfetto.dev (or ``chrome://tracing``). Three processes:

* ``learner``: thread ``steps`` (``wait_for_batch``, ``train``, ``weight_sync``, and
  ``sft`` / ``engine_warmup_wait`` before RL) and thread ``eval`` (``eval``: before and
  after RL, and each ``rl.eval_every`` evaluation beside training, which overlaps the
  steps; its ``args.step`` is the RL step it ended in);
* ``engine``: a thread per engine with its device calls (``prefill``, ``decode``)
  and the ``host_gap`` between them (waiting work, no call running; idle is blank);
* ``episodes``: a thread per sampled episode, named by its episode id: ``episode``,
  ``stage/init``, ``stage/run``, ``stage/eval``, and inside them each ``model_call``,
  ``env_step``, ``tool/<name>`` and ``env/<key>``.

:class:`TraceWriter` gets the spans from
:meth:`MetricsRecorder.add_span_listener <tunix_agentic.metrics.recorder.MetricsRecorder.add_span_listener>`
(an episode's spans are told apart by :data:`EPISODE`, which the episode runner
sets in each episode's task) and the device calls from the engine clocks'
observers (:func:`tunix_agentic.metrics.device_calls.add_observer`).

Bounded: ``trace.episodes_per_step`` episodes get a thread per RL step (the first
whose first span ends in it), the engine and new episodes are traced in one RL
step of every ``trace.every_steps``, and a file holds at most ``trace.max_events``
events: then it is closed with a note and the next begins, up to
``trace.max_files``, after which tracing stops with a note (in ``otherData`` and
as an instant event on the timeline). Nothing is lost on failure: each
:meth:`TraceWriter.begin_step` appends the step's events to the file as a new
gzip member and rewrites the closing member, so the file is a whole JSON
document after every step; a run killed mid-write leaves one that
:func:`read_trace` still reads.

:class:`StepProfiler` takes a ``jax.profiler`` trace of chosen RL steps into the
run's TensorBoard directory (``--profile-steps A:B``).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import gzip
import itertools
import json
import logging
import math
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from tunix_agentic.metrics import device_calls

_log = logging.getLogger(__name__)

EPISODE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tunix_agentic_trace_episode", default=None
)
"""The id of the episode the current asyncio task runs (set by the episode runner):
its spans go on that episode's thread of the trace."""

# Learner spans and their thread; other spans outside an episode are not traced.
LEARNER_SPANS = {
    "wait_for_batch": "steps",
    "train": "steps",
    "weight_sync": "steps",
    "sft": "steps",
    "engine_warmup_wait": "steps",
    "eval": "eval",
}
STAGES = frozenset({"stage/init", "stage/run", "stage/eval"})
_PROCESSES = {"learner": 1, "engine": 2, "episodes": 3}
_NUDGE = 1e-6  # s: a parent starts this much before its first child (Perfetto nests by start)
_EPISODE_MEMORY = 4096  # sampling decisions remembered (episodes under way)
_FLUSH_EVERY = 10_000  # buffered events written out even within a step


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """The run's trace (``trace:`` in a run's YAML); see the module docstring."""

    enabled: bool = True  # write RUN_DIR/trace/trace-NNN.json.gz; false: nothing is written
    episodes_per_step: int = 4  # episodes given a thread per RL step
    every_steps: int = 1  # engine and new episodes traced in one RL step of this many
    max_events: int = 200_000  # per file (~2-3 MB gzipped)
    max_files: int = 4  # then tracing stops, with a note

    def __post_init__(self):
        for key, low in (
            ("episodes_per_step", 0),
            ("every_steps", 1),
            ("max_events", 100),
            ("max_files", 1),
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"trace.{key} must be an integer >= {low}, got {value!r}")


@dataclasses.dataclass
class _Episode:
    """A sampled episode's thread, and what placing its next spans needs."""

    tid: int
    first_start: float = math.inf
    child_start: float = math.inf  # earliest start of its spans since its last stage
    stage_end: float = -math.inf
    env_step: tuple[float, float] | None = None  # the last env_step, for its tool calls
    tool_at: float = 0.0  # where the next tool call of that env_step starts


class TraceWriter:
    """Writes the run's trace under ``directory``; thread-safe (spans come from the event
    loop, executor threads and the engines' scheduler threads).

    ``step`` is the last finished RL step (0 on a fresh run): events until the first
    :meth:`begin_step` are the run's set-up and first evaluation. With
    ``config.enabled`` false nothing is written and every method returns at once.
    """

    def __init__(self, directory: str | os.PathLike, config: TraceConfig, *, step: int = 0):
        self.config = config
        self.directory = Path(directory)
        self.enabled = config.enabled
        self.files: list[Path] = []
        self._lock = threading.Lock()
        self._t0, self._wall0 = time.perf_counter(), time.time()
        self._step = step
        self._traced = True  # the set-up window is always traced
        self._sampled_in_step = 0
        self._episodes: collections.OrderedDict[str, _Episode | None] = collections.OrderedDict()
        self._tids: dict[tuple[int, Any], int] = {}
        self._thread_names: dict[tuple[int, int], str] = {}
        self._next_tid = itertools.count(1)
        self._engines = 0
        # Complete events as (pid, tid, name, start, end, args), other events as dicts.
        self._buffer: list[tuple | dict[str, Any]] = []
        self._counts = collections.Counter()
        self._note: str | None = None  # why tracing stopped, once it did
        self._stopped = False
        self._file: _TraceFile | None = None
        self._closed = False
        self._detach: Any = None
        if self.enabled:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._open_file()

    def attach(self, recorder: Any) -> None:
        """Take ``recorder``'s spans and the device calls of every engine clock in this
        process (one traced run per process at a time); :meth:`close` lets go of the clocks."""
        if not self.enabled:
            return
        recorder.add_span_listener(self.on_span)
        device_calls.add_observer(self.on_device)
        self._detach = lambda: device_calls.remove_observer(self.on_device)

    # ---- sources -------------------------------------------------------------

    def on_span(self, name: str, end: float, seconds: float) -> None:
        """A :class:`~tunix_agentic.metrics.recorder.MetricsRecorder` span listener."""
        if self._closed or not self.enabled:
            return
        episode = EPISODE.get()
        try:
            with self._lock:
                if episode is not None:
                    self._episode_span(episode, name, end - seconds, end)
                elif name in LEARNER_SPANS:
                    tid = self._thread("learner", LEARNER_SPANS[name], LEARNER_SPANS[name])
                    self._add(1, tid, name, end - seconds, end, {"step": self._step})
                else:
                    self._counts["spans_not_traced"] += 1
        except Exception:  # never fail the code that measured
            self._disable("a span could not be traced")

    def on_device(self, engine_id: int, name: str, start: float, end: float) -> None:
        """An engine clock observer (:func:`tunix_agentic.metrics.device_calls.add_observer`)."""
        if self._closed or not self.enabled or not self._traced or end - start < 1e-6:
            return
        try:
            with self._lock:
                tid = self._tids.get((2, engine_id))
                if tid is None:  # engines are numbered as they first appear
                    tid = self._thread("engine", engine_id, f"engine {self._engines}")
                    self._engines += 1
                self._add(2, tid, name, start, end)
        except Exception:
            self._disable("a device call could not be traced")

    # ---- steps and lifetime -------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """RL step ``step`` begins (the one before it ended): what was traced goes to disk,
        and a new step's episodes are sampled."""
        if not self.enabled or self._closed:
            return
        with self._lock:
            self._step = step
            self._traced = (step - 1) % self.config.every_steps == 0
            self._sampled_in_step = 0
            self._flush()

    def close(self) -> None:
        """Writes what is left and closes the file; later calls are no-ops."""
        if self._detach is not None:
            self._detach()
            self._detach = None
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._file is not None:
                self._flush(complete=True)
                self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- internals (the lock held) ---------------------------------------------------

    def _episode_span(self, episode: str, name: str, start: float, end: float) -> None:
        if episode in self._episodes:
            ep = self._episodes[episode]
        else:
            ep = None
            if self._traced and self._sampled_in_step < self.config.episodes_per_step:
                self._sampled_in_step += 1
                self._counts["episodes_sampled"] += 1
                ep = _Episode(self._thread("episodes", episode, episode))
            else:
                self._counts["episodes_not_sampled"] += 1
            self._episodes[episode] = ep
            if len(self._episodes) > _EPISODE_MEMORY:
                self._episodes.popitem(last=False)
        if ep is None:
            return
        args = None
        if name.startswith("tool/") and ep.env_step is not None:
            # Tool calls are recorded after their env_step with durations only: laid out in
            # call order from its start (exact lengths, approximate offsets).
            step_start, step_end, seconds = *ep.env_step, end - start
            start = min(max(ep.tool_at, step_start + _NUDGE), step_end)
            end = min(start + seconds, step_end)
            ep.tool_at = end
            args = {"placed": "in call order within its env_step"}
        elif name in STAGES:
            # A stage is recorded a moment after its children: it starts before the first.
            if ep.stage_end < ep.child_start <= start:
                start = ep.child_start - _NUDGE
            ep.child_start, ep.stage_end = math.inf, end
        elif name == "episode":
            start = min(start, ep.first_start - _NUDGE)
        else:
            ep.child_start = min(ep.child_start, start)
        if name == "env_step":
            ep.env_step, ep.tool_at = (start, end), start + _NUDGE
        ep.first_start = min(ep.first_start, start)
        self._add(3, ep.tid, name, start, end, args)

    def _thread(self, process: str, key: Any, name: str) -> int:
        pid = _PROCESSES[process]
        tid = self._tids.get((pid, key))
        if tid is None:
            tid = self._tids[(pid, key)] = next(self._next_tid)
            self._thread_names[(pid, tid)] = name
        return tid

    def _add(
        self, pid: int, tid: int, name: str, start: float, end: float, args: dict | None = None
    ) -> None:
        full = self._file.events + len(self._buffer) + 4 > self.config.max_events
        if full and not (self._stopped or self._closed):
            self._rotate()  # (room kept for a thread's names and the note)
        if self._stopped or self._closed:
            self._counts["events_dropped"] += 1
            return
        if (pid, tid) not in self._file.named:
            self._file.named.add((pid, tid))
            self._buffer.extend(_thread_meta(pid, tid, self._thread_names[(pid, tid)]))
        self._buffer.append((pid, tid, name, start, end, args))  # encoded when written
        if len(self._buffer) >= _FLUSH_EVERY:
            self._flush()

    def _us(self, t: float) -> float:
        return round((t - self._t0) * 1e6, 3)

    def _rotate(self) -> None:
        """The file is full: close it with a note; open the next, or stop."""
        last = len(self.files) >= self.config.max_files
        if last:
            self._note = (
                f"tracing stopped at RL step {self._step}: trace.max_events="
                f"{self.config.max_events} per file and trace.max_files={self.config.max_files} "
                "reached; later events were not traced"
            )
            note = self._note
        else:
            note = (
                f"file full at RL step {self._step} (trace.max_events={self.config.max_events}): "
                f"continued in {_file_name(self._next_index())}"
            )
        self._buffer.append(_instant(note, self._us(time.perf_counter())))
        self._flush(note=note)
        if last:
            self._stopped = True  # the file stays open: its closing member keeps the counts
            return
        self._file.close()
        self._open_file()

    def _open_file(self) -> None:
        path = self.directory / _file_name(self._next_index())
        self.files.append(path)
        header = [
            event
            for process, pid in _PROCESSES.items()
            for event in (
                {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process}},
                {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
            )
        ]
        self._file = _TraceFile(path, header, self._step)
        self._file.write([], self._other())

    def _next_index(self) -> int:
        taken = {p.name for p in self.directory.glob("trace-*.json.gz")}
        return next(i for i in itertools.count(1) if _file_name(i) not in taken)

    def _flush(self, *, complete: bool = False, note: str | None = None) -> None:
        events, self._buffer = self._buffer, []
        lines = [_encode(e, self._t0) for e in events]
        self._file.write(lines, self._other(complete=complete, note=note or self._note))

    def _other(self, *, complete: bool = False, note: str | None = None) -> dict[str, Any]:
        """The file's ``otherData``: what a reader needs to know about what it holds."""
        first = self._file.first_step if self._file is not None else self._step
        other = {
            "producer": "tunix-agentic",
            "wall_time_at_ts0": self._wall0,  # ts 0 is this time.time(): aligns with metrics.jsonl
            "steps": [first, self._step],
            "complete": complete,  # false: the run was still going (or was killed)
            **self._counts,
            "config": dataclasses.asdict(self.config),
        }
        if note:
            other["note"] = note
        return other

    def _disable(self, what: str) -> None:
        _log.exception("%s; the run's trace stops here", what)
        with self._lock, contextlib.suppress(Exception):  # failing to say so: nothing more
            self._stopped = True
            self._note = f"tracing stopped at RL step {self._step} by an error: {what}"
            self._flush()


class _TraceFile:
    """One ``.json.gz``: a gzip member per write, the last one always the closing
    ``], "otherData": {...}}`` (rewritten in place), so the file is whole JSON after every
    write."""

    def __init__(self, path: Path, header: list[dict[str, Any]], first_step: int):
        self.path = path
        self.first_step = first_step
        self.events = len(header)
        self.named: set[tuple[int, int]] = set()
        self._f = open(path, "wb")  # noqa: SIM115  (closed in close())
        lines = ",\n".join(_encode(e, 0.0) for e in header)
        self._f.write(gzip.compress(('{"traceEvents": [\n' + lines).encode(), 6))
        self._body_end = self._f.tell()

    def write(self, lines: list[str], other: dict[str, Any]) -> None:
        """Appends encoded events, then the closing member with ``other``."""
        self._f.seek(self._body_end)
        self._f.truncate()
        if lines:  # the header holds events, so each batch follows a comma
            self._f.write(gzip.compress((",\n" + ",\n".join(lines)).encode(), 6))
            self.events += len(lines)
            self._body_end = self._f.tell()
        closing = {"displayTimeUnit": "ms", "otherData": other}
        self._f.write(gzip.compress(("\n]," + json.dumps(closing)[1:] + "\n").encode(), 6))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _encode(event: tuple | dict[str, Any], t0: float) -> str:
    """One event as JSON; a complete event's times in µs since ``t0`` (its end rounded like
    its start, so events that touch never overlap)."""
    if isinstance(event, dict):
        return json.dumps(event, separators=(",", ":"))
    pid, tid, name, start, end, args = event
    ts = round((start - t0) * 1e6, 3)
    dur = max(0.0, round(round((end - t0) * 1e6, 3) - ts, 3))
    tail = f',"args":{json.dumps(args, separators=(",", ":"))}' if args else ""
    return (
        f'{{"ph":"X","name":{_quoted(name)},"pid":{pid},"tid":{tid},"ts":{ts},"dur":{dur}{tail}}}'
    )


@functools.lru_cache(maxsize=1024)
def _quoted(name: str) -> str:
    return json.dumps(name)


def _file_name(index: int) -> str:
    return f"trace-{index:03d}.json.gz"


def _thread_meta(pid: int, tid: int, name: str) -> list[dict[str, Any]]:
    """A thread's name, and its place: threads are listed in the order they appeared."""
    return [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}},
        {
            "ph": "M",
            "name": "thread_sort_index",
            "pid": pid,
            "tid": tid,
            "args": {"sort_index": tid},
        },
    ]


def _instant(note: str, ts: float) -> dict[str, Any]:
    return {"ph": "i", "s": "g", "name": "trace note", "pid": 1, "tid": 0, "ts": ts,
            "args": {"note": note}}  # fmt: skip


def read_trace(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a trace file, also one cut short by a kill mid-write (what its whole gzip
    members hold, the events array closed if it was not)."""
    data, parts = Path(path).read_bytes(), []
    while data:
        member = zlib.decompressobj(wbits=31)
        try:
            text = member.decompress(data)
        except zlib.error:
            break
        if not member.eof:
            break  # a member cut short
        parts.append(text)
        data = member.unused_data
    text = b"".join(parts).decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.rstrip().rstrip(",") + "\n]}")


def open_trace(
    directory: str | os.PathLike, config: TraceConfig, recorder: Any, *, step: int = 0
) -> TraceWriter:
    """A :class:`TraceWriter` fed by ``recorder``'s spans and every engine clock in this
    process (one traced run per process at a time); its ``close`` detaches it."""
    writer = TraceWriter(directory, config, step=step)
    writer.attach(recorder)
    return writer


# ---- jax.profiler over chosen RL steps ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProfileSteps:
    """RL steps ``first`` to ``last`` (1-based, inclusive) to profile with ``jax.profiler``."""

    first: int
    last: int

    def __post_init__(self):
        if self.first < 1 or self.last < self.first:
            raise ValueError(
                f"RL steps to profile must satisfy 1 <= A <= B, got {self.first}:{self.last}"
            )

    @classmethod
    def parse(cls, text: str) -> ProfileSteps:
        """``"A:B"`` -> steps A..B; raises ``ValueError`` saying what is wrong."""
        first, sep, last = text.partition(":")
        try:
            if not sep:
                raise ValueError
            a, b = int(first), int(last)
        except ValueError:
            raise ValueError(f"must look like A:B (RL steps, e.g. 3:5), got {text!r}") from None
        return cls(a, b)


class StepProfiler:
    """Starts ``jax.profiler`` when RL step ``steps.first`` begins and stops it when step
    ``steps.last`` has ended (or at :meth:`close`), writing the profile under ``log_dir``
    in TensorBoard's layout (``plugins/profile/<time>/``: its Profile tab, or XProf)."""

    def __init__(self, steps: ProfileSteps | None, log_dir: str | os.PathLike):
        self.steps = steps
        self.log_dir = os.fspath(log_dir)
        self.active = False
        self.done = steps is None

    def begin_step(self, step: int) -> None:
        """RL step ``step`` begins (a resumed run begins inside the window: the rest)."""
        if self.active and step > self.steps.last:
            self.close()
        elif not self.done and not self.active and self.steps.first <= step <= self.steps.last:
            import jax

            try:
                jax.profiler.start_trace(self.log_dir)
            except RuntimeError as exc:  # another trace is running: the run goes on
                _log.warning("--profile-steps: jax.profiler could not start: %s", exc)
                self.done = True
                return
            self.active = True

    def close(self) -> None:
        """Stops and writes the profile if one is under way."""
        if not self.active:
            return
        import jax

        self.active, self.done = False, True
        jax.profiler.stop_trace()
        _log.info("jax profile of RL steps %s written under %s", self.steps, self.log_dir)


class Timeline:
    """What a run keeps of its timeline: the trace and the profiler, stepped together."""

    def __init__(self, trace: TraceWriter, profiler: StepProfiler):
        self.trace, self.profiler = trace, profiler

    def begin_step(self, step: int) -> None:
        self.profiler.begin_step(step)
        self.trace.begin_step(step)

    def close(self) -> None:
        try:
            self.profiler.close()
        finally:
            self.trace.close()


def open_timeline(
    run_dir: str | os.PathLike,
    config: TraceConfig,
    recorder: Any,
    *,
    step: int = 0,
    profile_steps: ProfileSteps | None = None,
) -> Timeline:
    """The run's trace (``run_dir/trace``) and profiler (``run_dir/tensorboard``), from
    RL step ``step`` on (the last finished: 0 on a fresh run)."""
    run_dir = Path(run_dir)
    return Timeline(
        open_trace(run_dir / "trace", config, recorder, step=step),
        StepProfiler(profile_steps, run_dir / "tensorboard"),
    )
