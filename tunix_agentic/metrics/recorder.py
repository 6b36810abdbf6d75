"""Metrics recording: TensorBoard event files plus a JSONL log, from one object.

A run creates one `MetricsRecorder` and hands it to everything that measures
something. There are two ways to record:

* `scalar` / `scalars` write a value at a step immediately.
* `span`, `add_time`, `count` and `gauge` feed accumulators that `write_step`
  turns into scalars once per training step (`time/...`, `count/...`,
  `gauge/...`), so hot code only pays for a lock and a dict update.

Every span is also kept as a sample until the next `write_step`, which adds
`latency/<name>/p50_ms`, `/p95_ms` and `/p99_ms` (milliseconds) and a TensorBoard
histogram `hist/<name>` (seconds) for each span name that had several samples
since the last one (a span that ran once has its `time/<name>_s`). Memory
is bounded: at most `max_samples` samples per name per interval, a uniform
reservoir sample once there are more (the percentiles are then estimates).

Every write goes to TensorBoard event files under `log_dir` (through
TensorBoard's own `EventFileWriter`, so no TensorFlow is needed): the run's own
in `log_dir/<run_name>` (`log_dir` itself without a name), and a breakdown's
series each in a directory of its own below it, so TensorBoard draws each in its
own colour (:mod:`tunix_agentic.metrics.series`); and, unless
`jsonl=False`, as one line `{"step": ..., "wall_time": ..., <name>: <value>}`
to `log_dir/metrics.jsonl`. TensorBoard stores scalars as float32; the JSONL
keeps full float64 precision and writes non-finite values as `null`; it holds
scalars only (the percentiles, not the histograms).

All methods are thread-safe: spans are recorded from executor threads and
from the asyncio loop alike.
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO

import numpy as np
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.summary.writer.record_writer import RecordWriter

from tunix_agentic.metrics import series

JSONL_NAME = "metrics.jsonl"
# Keys every JSONL line carries; a metric may not shadow them.
_RESERVED = frozenset({"step", "wall_time"})
# Span samples kept per name per write_step interval, by default (~16 KiB each).
DEFAULT_MAX_SAMPLES = 2048
PERCENTILES = (50, 95, 99)
# A span needs this many samples in a step for percentiles (a once-a-step span has p50 = p99).
MIN_PERCENTILE_SAMPLES = 2
_HIST_BUCKETS = 30


def _check_name(name: object, *, top_level: bool = True) -> str:
    """Validates a metric name; `top_level` names become JSONL keys as they are."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"metric name must be a non-empty str, got {name!r}")
    if top_level and name in _RESERVED:
        raise ValueError(f"metric name {name!r} is reserved for the JSONL log")
    return name


def _as_float(name: str, value: object) -> float:
    """Converts a metric value to float, or raises a TypeError naming the metric."""
    # float("1.5") would succeed, but a string is almost always a bug upstream.
    if isinstance(value, str | bytes):
        raise TypeError(f"metric {name!r} must be numeric, got {type(value).__name__} {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]  # also numpy / 0-d jax scalars
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"metric {name!r} must be numeric, got {type(value).__name__} {value!r}"
        ) from e


def _as_step(step: object) -> int:
    try:
        return operator.index(step)  # type: ignore[arg-type]
    except TypeError as e:
        raise TypeError(f"step must be an integer, got {type(step).__name__} {step!r}") from e


def _nan_max(a: float, b: float) -> float:
    """max() that propagates nan, so a nan gauge reading is not silently hidden."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


class _Reservoir:
    """A uniform sample of at most ``cap`` of the values offered (Vitter's Algorithm R):
    all of them while there are at most ``cap``."""

    __slots__ = ("cap", "seen", "values")

    def __init__(self, cap: int):
        self.cap = cap
        self.seen = 0
        self.values: list[float] = []

    def add(self, value: float, rng: random.Random) -> None:
        self.seen += 1
        if len(self.values) < self.cap:
            self.values.append(value)
        else:
            j = rng.randrange(self.seen)
            if j < self.cap:
                self.values[j] = value


def percentiles(samples: list[float] | np.ndarray) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of ``samples`` (non-empty), by linear
    interpolation between the closest ranks (NumPy's default, e.g. p95 of 1..100 is 95.05)."""
    values = np.percentile(np.asarray(samples, dtype=np.float64), PERCENTILES)
    return {f"p{q}": float(v) for q, v in zip(PERCENTILES, values, strict=True)}


def histogram_value(tag: str, samples: list[float]) -> summary_pb2.Summary.Value:
    """A TensorBoard histogram of ``samples`` (non-empty): up to 30 equal-width buckets
    between their min and max, with exact count, sum and sum of squares."""
    x = np.asarray(samples, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    if hi > lo:
        counts, edges = np.histogram(x, bins=min(_HIST_BUCKETS, x.size), range=(lo, hi))
        limits = edges[1:].tolist()
    else:  # one value: one bucket
        counts, limits = np.array([x.size]), [hi]
    histo = summary_pb2.HistogramProto(
        min=lo,
        max=hi,
        num=float(x.size),
        sum=float(x.sum()),
        sum_squares=float(np.square(x).sum()),
        bucket_limit=limits,
        bucket=counts.astype(np.float64).tolist(),
    )
    return summary_pb2.Summary.Value(tag=tag, histo=histo)


class MetricsRecorder:
    """The one place a run records what it measures.

    Args:
      log_dir: directory for the event files and `metrics.jsonl` (created if
        missing). `None` keeps everything in memory: accumulators still work
        and `write_step` still returns its dict, but nothing is written.
      run_name: the name TensorBoard shows for the run (its event files go to
        `log_dir/run_name`); None writes them to `log_dir` (shown as ".").
      jsonl: also append each write to `log_dir/metrics.jsonl`.
      max_samples: span samples kept per span name between two `write_step`s,
        for the `latency/...` percentiles and `hist/...` histograms; 0 turns
        both off.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike | None,
        *,
        jsonl: bool = True,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        run_name: str | None = None,
    ):
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 0:
            raise ValueError(f"max_samples must be an int >= 0, got {max_samples!r}")
        self._lock = threading.Lock()
        self._closed = False
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        if run_name is not None and (not run_name or os.sep in run_name or run_name in (".", "..")):
            raise ValueError(f"run_name must be a plain directory name, got {run_name!r}")
        self._writer: EventFileWriter | None = None
        self._series_writers: dict[str, EventFileWriter] = {}  # by run, under the run's dir
        self._jsonl: IO[str] | None = None
        self.event_dir: str | None = None  # where the run's own event files go
        if self.log_dir is not None:
            os.makedirs(self.log_dir, exist_ok=True)
            self.event_dir = os.path.join(self.log_dir, run_name or "")
            self._writer = EventFileWriter(self.event_dir, flush_secs=10)
            if jsonl:
                # Line-buffered: a crashed run keeps every finished line.
                self._jsonl = open(  # closed in close()
                    os.path.join(self.log_dir, JSONL_NAME), "a", buffering=1, encoding="utf-8"
                )
        self._span_sum: dict[str, float] = {}
        self._span_count: dict[str, int] = {}
        self._span_total: dict[str, float] = {}
        self._written: set[str] = set()  # every scalar name written so far
        self._counters: dict[str, float] = {}
        self._counters_written: dict[str, float] = {}  # their values at the last write_step
        self._gauge_last: dict[str, float] = {}
        self._gauge_max: dict[str, float] = {}
        self._span_listeners: list[Callable[[str, float, float], None]] = []
        self._write_listeners: list[Callable[[Mapping[str, float], int], None]] = []
        self._max_samples = max_samples
        self._samples: dict[str, _Reservoir] = {}
        self._rng = random.Random(0)  # reservoir choices; seeded so runs repeat

    def add_write_listener(self, fn: Callable[[Mapping[str, float], int], None]) -> None:
        """Call ``fn(values, step)`` with every write of scalars from now on (each
        ``scalars`` call and each ``write_step``), under the recorder's lock, after the
        event file and the JSONL have it (e.g. a W&B mirror)."""
        self._write_listeners.append(fn)

    def add_span_listener(self, fn: Callable[[str, float, float], None]) -> None:
        """Call ``fn(name, end, seconds)`` for every span recorded from now on (``end``
        a ``time.perf_counter()`` reading), outside the lock, in the recording thread.
        A listener that raises is removed and its error re-raised once."""
        self._span_listeners.append(fn)

    # ---- immediate scalars -------------------------------------------------

    def scalar(self, name: str, value: float, step: int) -> None:
        """Writes one scalar at `step` now."""
        self.scalars({name: value}, step)

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Writes several scalars at `step` now (one event, one JSONL line)."""
        clean = {_check_name(k): _as_float(k, v) for k, v in values.items()}
        step = _as_step(step)
        with self._lock:
            self._write_locked(clean, step)

    # ---- accumulators, emitted by write_step -------------------------------

    @contextlib.contextmanager
    def span(self, name: str, *, per_step: bool = True) -> Iterator[None]:
        """Times the block with `time.perf_counter`; recorded also if it raises.
        `per_step=False`: only the span listeners (the trace, the step time) hear of it,
        for a span whose figure its caller logs at a step of its own (an evaluation)."""
        _check_name(name, top_level=False)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_time(name, time.perf_counter() - start, per_step=per_step)

    def add_time(self, name: str, seconds: float, *, per_step: bool = True) -> None:
        """Adds `seconds` to the span accumulator for `name` (as one span); with
        `per_step=False` only the span listeners hear of it."""
        _check_name(name, top_level=False)
        seconds = _as_float(name, seconds)
        end = time.perf_counter()
        if per_step:
            self._accumulate(name, seconds)
        for fn in self._span_listeners:
            try:
                fn(name, end, seconds)
            except Exception:
                self._span_listeners.remove(fn)
                raise

    def _accumulate(self, name: str, seconds: float) -> None:
        with self._lock:
            self._span_sum[name] = self._span_sum.get(name, 0.0) + seconds
            self._span_count[name] = self._span_count.get(name, 0) + 1
            self._span_total[name] = self._span_total.get(name, 0.0) + seconds
            if self._max_samples and math.isfinite(seconds):
                reservoir = self._samples.get(name)
                if reservoir is None:
                    reservoir = self._samples[name] = _Reservoir(self._max_samples)
                reservoir.add(seconds, self._rng)

    def count(self, name: str, n: float = 1.0) -> None:
        """Adds `n` to a cumulative counter; counters are never reset."""
        _check_name(name, top_level=False)
        n = _as_float(name, n)
        with self._lock:
            self._counters[name] = self._counters.get(name, 0.0) + n

    def gauge(self, name: str, value: float) -> None:
        """Sets a gauge (last value wins) and tracks its max since the last write_step."""
        _check_name(name, top_level=False)
        value = _as_float(name, value)
        with self._lock:
            self._gauge_last[name] = value
            prev = self._gauge_max.get(name)
            self._gauge_max[name] = value if prev is None else _nan_max(prev, value)

    def write_step(self, step: int, extra: Mapping[str, float] | None = None) -> dict[str, float]:
        """Writes all accumulators as scalars at `step` and returns what it wrote.

        Emits `time/{name}_s` (seconds since the last write_step) and
        `time/{name}_count` for every span name timed since the last write_step,
        `latency/{name}/p50_ms|p95_ms|p99_ms` for every span name recorded at least
        `MIN_PERCENTILE_SAMPLES` times since the last write_step (finite durations
        only), `count/{name}_total` (cumulative) and `count/{name}_per_step` (since
        the last write_step) for every counter, `gauge/{name}` and
        `gauge/{name}_max` for every gauge, then `extra` as given (an `extra` key
        overrides a generated one). The event files also get a histogram
        `hist/{name}` (seconds) per span name with percentiles (not in the
        returned dict, nor in the JSONL). Span sums, counts and samples are
        then reset, and gauge maxima restart from the gauge's current value,
        since the gauge keeps holding that value into the next interval.
        """
        step = _as_step(step)
        clean_extra = {_check_name(k): _as_float(k, v) for k, v in (extra or {}).items()}
        with self._lock:
            out: dict[str, float] = {}
            for name in self._span_sum:
                if not self._span_count[name]:
                    continue  # not timed in this step: no zero to chart
                out[f"time/{name}_s"] = self._span_sum[name]
                out[f"time/{name}_count"] = float(self._span_count[name])
            histograms = []
            for name, reservoir in self._samples.items():
                if reservoir.seen < MIN_PERCENTILE_SAMPLES:
                    continue
                for key, value in percentiles(reservoir.values).items():
                    out[f"latency/{name}/{key}_ms"] = value * 1e3
                histograms.append(histogram_value(f"hist/{name}", reservoir.values))
            for name, total in self._counters.items():
                out[f"count/{name}_total"] = total
                out[f"count/{name}_per_step"] = total - self._counters_written.get(name, 0.0)
            self._counters_written = dict(self._counters)
            for name, last in self._gauge_last.items():
                out[f"gauge/{name}"] = last
                out[f"gauge/{name}_max"] = self._gauge_max[name]
            out.update(clean_extra)
            self._write_locked(out, step, histograms)
            self._samples = {}
            self._span_sum = dict.fromkeys(self._span_sum, 0.0)
            self._span_count = dict.fromkeys(self._span_count, 0)
            self._gauge_max = dict(self._gauge_last)
        return out

    def write_summaries(
        self, values: list[summary_pb2.Summary.Value], step: int, *, run: str = ""
    ) -> None:
        """Writes TensorBoard summary values (a plugin's tensors, e.g. the custom-scalars
        layout of :mod:`~tunix_agentic.metrics.layout`) at ``step`` to the event file
        only (of the series run ``run`` below the run's directory, "" for the run's own);
        the JSONL holds scalars alone. No-op without a ``log_dir``."""
        step = _as_step(step)
        for v in values:
            if not isinstance(v, summary_pb2.Summary.Value):
                raise TypeError(f"summary values must be Summary.Value protos, got {type(v)}")
            _check_name(v.tag)
        with self._lock:
            if self._closed:
                raise RuntimeError("MetricsRecorder is closed")
            if self._writer is not None and values:
                summary = summary_pb2.Summary(value=values)
                self._run_writer(run).add_event(
                    event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
                )

    def written_names(self) -> set[str]:
        """Every scalar name written so far (the JSONL's names)."""
        with self._lock:
            return set(self._written)

    def totals(self) -> dict[str, float]:
        """Cumulative seconds per span name since creation (not reset by write_step)."""
        with self._lock:
            return dict(self._span_total)

    # ---- lifecycle ---------------------------------------------------------

    def flush(self) -> None:
        """Forces pending events and JSONL lines to disk."""
        with self._lock:
            if self._closed:
                return
            for writer in self._writers():
                writer.flush()
            if self._jsonl is not None:
                self._jsonl.flush()

    def close(self) -> None:
        """Flushes and closes the files; later calls are no-ops."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for writer in self._writers():
                writer.close()  # flushes first
            if self._jsonl is not None:
                self._jsonl.close()

    def __enter__(self) -> MetricsRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _writers(self) -> list[EventFileWriter]:
        return [w for w in (self._writer, *self._series_writers.values()) if w is not None]

    def _run_writer(self, run: str) -> EventFileWriter:
        """The writer of the run's own events ("") or of a series' run (made on first use)."""
        if not run:
            return self._writer
        writer = self._series_writers.get(run)
        if writer is None:
            writer = EventFileWriter(os.path.join(self.event_dir, run), flush_secs=10)
            self._series_writers[run] = writer
        return writer

    def _write_locked(
        self,
        values: Mapping[str, float],
        step: int,
        histograms: Sequence[summary_pb2.Summary.Value] = (),
    ) -> None:
        """Writes one TensorBoard event (scalars and ``histograms``) and one JSONL line
        (scalars); caller holds the lock."""
        if self._closed:
            raise RuntimeError("MetricsRecorder is closed")
        if not values:
            return
        self._written.update(values)
        wall_time = time.time()
        if self._writer is not None:
            by_run: dict[str, list[summary_pb2.Summary.Value]] = {"": list(histograms)}
            for k, v in values.items():
                run, tag = series.place(k)
                by_run.setdefault(run, []).append(
                    summary_pb2.Summary.Value(tag=tag, simple_value=v)
                )
            for run, summary_values in by_run.items():
                if summary_values:
                    summary = summary_pb2.Summary(value=summary_values)
                    self._run_writer(run).add_event(
                        event_pb2.Event(wall_time=wall_time, step=step, summary=summary)
                    )
        if self._jsonl is not None:
            row: dict[str, float | int | None] = {"step": step, "wall_time": wall_time}
            row.update({k: v if math.isfinite(v) else None for k, v in values.items()})
            self._jsonl.write(json.dumps(row, allow_nan=False) + "\n")
        for fn in self._write_listeners:
            fn(values, step)


def event_runs(log_dir: str | os.PathLike) -> list[tuple[str, str]]:
    """``(directory, series run)`` of every directory under ``log_dir`` holding event files:
    the run's own (the shallowest, series run "") and its series' runs below it (see
    :mod:`tunix_agentic.metrics.series`); profiler output (``plugins/``) is left out."""
    found = []
    for root, dirs, files in os.walk(os.fspath(log_dir)):
        dirs[:] = sorted(d for d in dirs if d != "plugins")
        if any("tfevents" in f for f in files):
            found.append(root)
    if not found:
        return []
    main = min(found, key=lambda d: (d.count(os.sep), d))
    runs = []
    for d in found:
        rel = os.path.relpath(d, main)
        if not rel.startswith(".."):
            runs.append((d, "" if rel == "." else rel.replace(os.sep, "/")))
    return sorted(runs, key=lambda r: (r[1] != "", r[1]))  # the run's own first


def read_scalars(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Reads every scalar under `log_dir` with TensorBoard's own loader, by its flat name.

    Returns `{name: [(step, value), ...]}` sorted by step (values are float32,
    as TensorBoard stores them), the series' runs' scalars under the names they were
    recorded by (`step_time/train_s`, not run `step_time/train`'s `step_time/part_s`).
    Nothing is sampled away or purged.
    """
    path = os.fspath(log_dir)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no such log directory: {path}")
    out: dict[str, list[tuple[int, float]]] = {}
    for directory, run in event_runs(path):
        acc = event_accumulator.EventAccumulator(
            directory,
            size_guidance={event_accumulator.SCALARS: 0},
            purge_orphaned_data=False,
        )
        acc.Reload()
        for tag in acc.Tags()[event_accumulator.SCALARS]:
            name = series.flat_name(run, tag)
            if name is not None:
                points = out.setdefault(name, [])
                points.extend((e.step, e.value) for e in acc.Scalars(tag))
    return {name: sorted(points, key=lambda p: p[0]) for name, points in out.items()}


def drop_records(log_dir: str | os.PathLike, late: Callable[[int, frozenset[str]], bool]) -> int:
    """Remove every record ``late(step, tags)`` calls late from ``log_dir``; returns how many
    lines and events went.

    A resumed run calls this before it writes anything: what the interrupted run
    logged past its checkpoint is redone by the resumed run, and would otherwise
    appear twice (TensorBoard draws a step written twice as a zig-zag). A record is
    one ``metrics.jsonl`` line or one event, decided by its step and metric names,
    never by its wall time (a clock that jumped, or a run moved to another host,
    neither duplicates nor drops a record). A line cut short by a kill is dropped.
    Event files and ``metrics.jsonl`` are rewritten in place (through a temporary
    file and a rename).
    """
    path = os.fspath(log_dir)
    if not os.path.isdir(path):
        return 0
    dropped = 0
    jsonl = os.path.join(path, JSONL_NAME)
    if os.path.isfile(jsonl):
        with open(jsonl, encoding="utf-8") as f:
            lines = f.readlines()
        keep = []
        for line in lines:
            try:
                row = json.loads(line)
                step = _as_step(row["step"])
                drop = late(step, frozenset(row) - _RESERVED)
            except (ValueError, KeyError, TypeError):
                drop = True  # a line cut short by a kill
            if drop:
                dropped += 1
            else:
                keep.append(line if line.endswith("\n") else line + "\n")
        _replace(jsonl, lambda f: f.writelines(keep), text=True)
    files = [
        (os.path.join(directory, name), run)
        for directory, run in event_runs(path)
        for name in sorted(os.listdir(directory))
        if "tfevents" in name
    ]
    for events, run in files:
        # The raw loader: the parsed one rewrites scalars into tensors as it reads.
        loader = event_file_loader.RawEventFileLoader(events)
        kept = []
        for record in loader.Load():  # stops quietly at a record cut short by a kill
            event = event_pb2.Event.FromString(record)
            tags = frozenset(series.flat_name(run, v.tag) or v.tag for v in event.summary.value)
            if event.HasField("summary") and late(event.step, tags):
                dropped += 1
            else:
                kept.append(record)

        def write(f, kept=kept):
            writer = RecordWriter(f)
            for record in kept:
                writer.write(record)

        _replace(events, write, text=False)
    return dropped


def _replace(path: str, write, *, text: bool) -> None:
    tmp = path + ".rewrite"
    with open(tmp, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
