"""What the run's instrumentation costs: RL step time with it on and off, printed.

"On" is the default: latency percentiles and histograms of every span
(``metrics.latency_samples``), the TensorBoard layout (``metrics.layout``) and the
Perfetto trace (``trace.enabled``). "Off" turns exactly those three off (:data:`OFF`)
and nothing else: the always-on scalars (span sums, counters, gauges, learner and
rollout statistics) stay, as a run cannot do without them, and W&B mirroring and
``--profile-steps`` are off on both sides. With percentiles off the recorder keeps no
span sample and computes no percentile or histogram; with the trace off no span
listener and no engine-clock observer is attached (the clocks skip their
notifications when nobody listens); the layout is written once, before RL.

The RL loop is the default recipe's (configs/calculator_tiny.yaml), through the real
:class:`~tunix_agentic.trainer.Trainer`: its SFT warm start (2,000 steps, held-out
success ~0, as in a default run) runs once, and every measured run resumes from that
checkpoint (a copy of it) for ``BENCH_RL_STEPS`` of the recipe's RL steps (all 40 by
default), so both sides start from the same weights, optimizer state and task stream,
with the same seed. Runs go as interleaved pairs in one process (on, off, then off,
on, ...: the side that goes first alternates, so a drift of the machine falls on
both). Each run's engine compiles its shapes before RL (``engine.warmup=true``); XLA's
persistent compilation cache (under the warm start's directory) serves them from the
second run on, which takes a run's start from minutes to seconds.

A step's time is the wall time from the previous step's metrics row to its own, the
whole cycle of the loop: the ``step_time/wall_s`` a run logs counts the loop's own
bookkeeping after a step (writing its scalars, flushing its trace) in the next step's
``other``, so the two differ by where that bookkeeping lands. Only steady steps count: the first
``BENCH_WARMUP_STEPS`` are left out, and so is every step during which XLA compiled
anything (a new length bucket of the train step, say), found from JAX's own compile
events (``jax.monitoring``). A pair's ratio is the median on-step over the median
off-step, over the steps steady on both sides; the median ratio over pairs and its
interquartile range are printed (goal: at most 1.03), never asserted. Each side's
generated tokens per step are printed too: they match when both sides did the same
work (same seed, weights and tasks; which policy version samples an episode could
depend on timing, with ``rollout.max_staleness: 1``).

Two figures depend less on the machine's other load than wall time does:

* the process's CPU seconds per step (:class:`StepCPU`: every thread, the XLA compute
  included), on over off, per pair, printed like the wall ratio;
* :class:`HookClock` times every call into the instrumentation (:data:`HOOKS`: the
  trace's span listener and step flush, the engine clocks' notifications with the
  trace's device events, the recorder's reservoir sampling, percentiles and
  histograms) in the calling thread's CPU time, printed as a share of the step time,
  in all and by hook. Not timed: the event-file writes of the bigger events (on
  TensorBoard's writer thread). Wall seconds inside the hooks are printed too, but
  they are mostly where the event loop's thread happened to hand the GIL to another
  thread (the engine's scheduler, the learner), not the hooks' cost: with the
  reservoir's ``add`` inlined into ``MetricsRecorder.add_time`` (tried, then taken
  back), ~120 ms per step of them moved from it to the trace's span listener, the next
  Python-level call, unchanged in total.

The hooks are timed on both sides (on the off side they are not called). A step's
process CPU seconds are read at its ``write_step``.

On SIGTERM (``kill PID``) the run under way stops and the figures of the finished pairs are
printed.

    python -m profiling.bench_instrumentation
    BENCH_PAIRS=12 BENCH_RL_STEPS=20 BENCH_WARM_DIR=/tmp/warm python -m profiling.bench_instrumentation

Environment: BENCH_PAIRS (8), BENCH_RL_STEPS (the recipe's 40), BENCH_WARMUP_STEPS (2),
BENCH_SEED (0), BENCH_WARM_DIR (none: a temporary warm start; a directory keeps it and
the compilation cache, and a later run with the same seed reuses them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import jax

from profiling.common import env_int
from tunix_agentic.compiles import BACKEND_COMPILE_EVENT
from tunix_agentic.config import load_config
from tunix_agentic.inference.clock import EngineClock
from tunix_agentic.metrics import recorder
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.metrics.trace import TraceWriter
from tunix_agentic.trainer import RunInterrupted, train

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml")
# The instrumentation the issue prices, and nothing more.
OFF = ["metrics.latency_samples=0", "metrics.layout=false", "trace.enabled=false"]
RECIPE_RL_STEPS = load_config(CONFIG).rl.steps
# Every call into the instrumentation a step makes: (owner, attribute). The engine
# clock's ``_notify`` runs only when an observer (the trace) listens, and holds the
# trace's ``on_device`` calls.
HOOKS = (
    (TraceWriter, "on_span"),
    (TraceWriter, "begin_step"),
    (EngineClock, "_notify"),
    (recorder._Reservoir, "add"),
    (recorder, "percentiles"),
    (recorder, "histogram_value"),
)


class CompileLog:
    """Wall-clock intervals of every XLA backend compilation in this process, any thread."""

    def __init__(self) -> None:
        self.intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)

    def _on_duration(self, event: str, duration_secs: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            end = time.time()
            with self._lock:
                self.intervals.append((end - duration_secs, end))

    def overlaps(self, start: float, end: float) -> bool:
        with self._lock:
            return any(s < end and start < e for s, e in self.intervals)


class StepCPU:
    """The process's CPU seconds (every thread: Python, XLA's compute) at each RL step's
    ``write_step``, by step, while :meth:`installed`: a step's CPU time is the difference
    from the previous step's. Other processes on the machine change it far less than
    they change wall time."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}

    @contextlib.contextmanager
    def installed(self) -> Iterator[StepCPU]:
        original = MetricsRecorder.__dict__["write_step"]
        at, cpu = self.at, time.process_time

        @functools.wraps(original)
        def write_step(recorder_, step, *args, **kwargs):
            at[step] = cpu()
            return original(recorder_, step, *args, **kwargs)

        MetricsRecorder.write_step = write_step
        try:
            yield self
        finally:
            MetricsRecorder.write_step = original


class HookClock:
    """Seconds spent inside the given functions and methods while :meth:`installed`, from
    any thread, as ``(end, wall seconds, CPU seconds)`` (``end`` in ``time.time()``
    terms). The wall seconds include waits for the GIL and for locks; the CPU seconds
    are the calling thread's own work.

    Each call pays four clock readings and a list append (about 1 µs); the functions'
    behaviour is unchanged.
    """

    def __init__(self, hooks=HOOKS) -> None:
        self.hooks = tuple(hooks)
        self.names = [f"{getattr(o, '__name__', o)}.{n}" for o, n in self.hooks]
        # (end, wall s, CPU s, hook index), appended from any thread (atomic)
        self.calls: list[tuple[float, float, float, int]] = []
        self._offset = time.time() - time.perf_counter()

    def _timed(self, fn, index: int):
        calls, offset, clock, cpu = self.calls, self._offset, time.perf_counter, time.thread_time

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start, start_cpu = clock(), cpu()
            try:
                return fn(*args, **kwargs)
            finally:
                end_cpu, end = cpu(), clock()
                calls.append((end + offset, end - start, end_cpu - start_cpu, index))

        return timed

    @contextlib.contextmanager
    def installed(self) -> Iterator[HookClock]:
        saved = []
        for index, (owner, name) in enumerate(self.hooks):
            fn = getattr(owner, name)  # AttributeError names a hook that went away
            saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, self._timed(fn, index))
        try:
            yield self
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)

    def seconds_between(self, start: float, end: float) -> tuple[float, float]:
        """Wall and CPU seconds inside the hooks, of the calls that ended in ``(start, end]``
        (``time.time()`` readings)."""
        inside = [(w, c) for e, w, c, _ in list(self.calls) if start < e <= end]
        return sum(w for w, _ in inside), sum(c for _, c in inside)

    def by_hook(self, start: float, end: float) -> dict[str, tuple[float, float]]:
        """Wall and CPU seconds inside each hook, of the calls that ended in ``(start, end]``."""
        wall, cpu = dict.fromkeys(self.names, 0.0), dict.fromkeys(self.names, 0.0)
        for e, w, c, i in list(self.calls):
            if start < e <= end:
                wall[self.names[i]] += w
                cpu[self.names[i]] += c
        return {name: (wall[name], cpu[name]) for name in self.names}


@dataclasses.dataclass
class RunFigures:
    """One run's RL steps: each step's wall time (metrics row to metrics row), its
    generated tokens and its seconds inside the instrumentation (wall and CPU), by step,
    for the steady steps; how many steps it wrote; what it wrote of the instrumentation."""

    step_s: dict[int, float]
    tokens: dict[int, float]
    hook_s: dict[int, float]
    hook_cpu_s: dict[int, float]
    cpu_s: dict[int, float]  # the process's CPU seconds (all threads)
    train_s: dict[int, float]
    steps: int
    wrote: dict[str, bool]
    # CPU seconds per steady step inside each hook, averaged over the steady steps.
    hook_by: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


def step_periods(rows: list[dict]) -> list[tuple[int, float, float]]:
    """``(step, start, end)`` wall-clock interval of each RL step row (a row with
    ``step_time/wall_s``) that follows another: from the previous row's ``wall_time`` to
    its own, the whole loop cycle (the step, then the bookkeeping that writes its row)."""
    rl = sorted((r for r in rows if r.get("step_time/wall_s") is not None), key=lambda r: r["step"])
    return [
        (row["step"], prev["wall_time"], row["wall_time"])
        for prev, row in itertools.pairwise(rl)
        if row["step"] == prev["step"] + 1
    ]


def pair_ratio(on: dict[int, float], off: dict[int, float]) -> tuple[float, list[int]]:
    """Median on-step time over median off-step time, over the steps both have, and
    those steps."""
    common = sorted(on.keys() & off.keys())
    if not common:
        raise ValueError("no RL step is steady on both sides: raise BENCH_RL_STEPS")
    return statistics.median(on[s] for s in common) / statistics.median(
        off[s] for s in common
    ), common


def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles (the interquartile range), min and max of ``values``."""
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "min": min(values),
        "max": max(values),
    }


def warm_start(warm_dir: Path, seed: int) -> Path:
    """The recipe's SFT warm start (no RL step) in ``warm_dir``, or the one already
    there; returns the run directory holding its checkpoint."""
    marker = warm_dir / "bench_warm.json"
    if marker.is_file():
        got = json.loads(marker.read_text())
        if got.get("seed") == seed and Path(got["run_dir"], "checkpoints").is_dir():
            print(f"warm start: reusing {got['run_dir']}", flush=True)
            return Path(got["run_dir"])
    t0 = time.perf_counter()
    result = train(
        CONFIG,
        [f"seed={seed}", "rl.steps=0", "rl.eval_tasks=20", f"run_dir={warm_dir / 'run'}"],
        progress=False,
    )
    print(
        f"warm start: the recipe's SFT in {time.perf_counter() - t0:.0f}s, held-out "
        f"success {result.success_before:.2f} ({result.run_dir})",
        flush=True,
    )
    marker.write_text(json.dumps({"seed": seed, "run_dir": result.run_dir}))
    return Path(result.run_dir)


def measure(
    warm: Path,
    overrides: list[str],
    run_dir: Path,
    compiles: CompileLog,
    hooks: HookClock,
    warmup: int,
    step_cpu: StepCPU,
) -> RunFigures:
    """One run resumed from the warm start: its steady steps' figures."""
    shutil.copytree(warm, run_dir)
    tb, trace = run_dir / "tensorboard", run_dir / "trace"
    copied = set(tb.glob("*tfevents*")) | set(trace.glob("*"))  # the warm start's
    hooks.calls.clear()  # (the same list the timed hooks append to)
    step_cpu.at.clear()
    train(None, overrides, resume_dir=str(run_dir), progress=False)
    rows = [json.loads(line) for line in (tb / "metrics.jsonl").open()]
    by_step = {r["step"]: r for r in rows if r.get("step_time/wall_s") is not None}
    figures = RunFigures({}, {}, {}, {}, {}, {}, len(by_step), wrote={})
    for step, start, end in step_periods(rows):
        if step > warmup and not compiles.overlaps(start, end):
            figures.step_s[step] = end - start
            figures.cpu_s[step] = step_cpu.at[step] - step_cpu.at[step - 1]
            figures.train_s[step] = by_step[step].get("time/train_s", 0.0)
            figures.tokens[step] = by_step[step].get("rollout/generated_tokens", 0.0)
            figures.hook_s[step], figures.hook_cpu_s[step] = hooks.seconds_between(start, end)
            for name, (wall, cpu) in hooks.by_hook(start, end).items():
                w, c = figures.hook_by.get(name, (0.0, 0.0))
                figures.hook_by[name] = (w + wall, c + cpu)
    n = max(len(figures.step_s), 1)
    figures.hook_by = {name: (w / n, c / n) for name, (w, c) in figures.hook_by.items()}
    events = [p for p in tb.glob("*tfevents*") if p not in copied]
    figures.wrote = {
        "percentiles": any(k.startswith("latency/") for r in by_step.values() for k in r),
        "trace": any(p not in copied for p in trace.glob("trace-*.json.gz")),
        # The layout goes to the event file only: its plugin's name is in the bytes.
        "layout": any(b"custom_scalars" in p.read_bytes() for p in events),
    }
    return figures


def main() -> dict:
    pairs = env_int("BENCH_PAIRS", 8)
    warmup = env_int("BENCH_WARMUP_STEPS", 2)
    seed = env_int("BENCH_SEED", 0)
    rl_steps = env_int("BENCH_RL_STEPS", RECIPE_RL_STEPS)
    base = [
        f"rl.steps={rl_steps}",
        "rl.eval_tasks=20",
        "rl.checkpoint_every=0",
        # Every engine shape compiled before RL, as on an accelerator: more RL steps are
        # steady. The RL steps' work is the recipe's.
        "engine.warmup=true",
    ]
    compiles = CompileLog()
    hooks = HookClock()
    step_cpu = StepCPU()
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    shares: dict[str, list[float]] = {"wall": [], "cpu": []}
    runs: dict[str, list[RunFigures]] = {"on": [], "off": []}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-instr-")))
        warm_root = Path(os.environ.get("BENCH_WARM_DIR") or tmp / "warm")
        # Each run's engine compiles its shapes again (new jit objects): from the second
        # run on, XLA's persistent cache serves them in seconds instead of minutes.
        jax.config.update("jax_compilation_cache_dir", str(warm_root / "xla-cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        warm = warm_start(warm_root, seed)
        stack.enter_context(hooks.installed())
        stack.enter_context(step_cpu.installed())
        for k in range(pairs):
            order = ("on", "off") if k % 2 == 0 else ("off", "on")
            got: dict[str, RunFigures] = {}
            try:
                for side in order:
                    extra = OFF if side == "off" else []
                    got[side] = measure(
                        warm, [*base, *extra], tmp / f"{side}{k}", compiles, hooks, warmup, step_cpu
                    )
            except (KeyboardInterrupt, RunInterrupted):
                if not ratios:
                    raise
                print(f"interrupted: the figures below are over the first {k} pairs")
                pairs = k
                break
            for side in order:
                runs[side].append(got[side])
            for side, expect in (("on", True), ("off", False)):
                wrong = [what for what, did in got[side].wrote.items() if did != expect]
                if wrong:
                    raise SystemExit(f"pair {k + 1}: the {side} side wrote {wrong} wrongly")
            ratio, common = pair_ratio(got["on"].step_s, got["off"].step_s)
            ratios.append(ratio)
            cpu_ratio, _ = pair_ratio(
                {s: got["on"].cpu_s[s] for s in common}, {s: got["off"].cpu_s[s] for s in common}
            )
            cpu_ratios.append(cpu_ratio)
            on = got["on"]
            step_sum = sum(on.step_s[s] for s in common)
            shares["wall"].append(sum(on.hook_s[s] for s in common) / step_sum)
            shares["cpu"].append(sum(on.hook_cpu_s[s] for s in common) / step_sum)

            def mean(values, common=common):
                return statistics.mean(values[s] for s in common)

            print(
                f"pair {k + 1} ({order[0]} first), {len(common)} steps steady on both "
                f"(of {on.steps}): "
                + ", ".join(
                    f"{side} {statistics.median(got[side].step_s[s] for s in common):.3f} "
                    f"s/step (train {statistics.median(got[side].train_s[s] for s in common):.3f}"
                    f", CPU {statistics.median(got[side].cpu_s[s] for s in common):.3f}) "
                    f"{mean(got[side].tokens):.0f} tok/step, hooks "
                    f"{1e3 * mean(got[side].hook_s):.1f} ms wall "
                    f"{1e3 * mean(got[side].hook_cpu_s):.1f} ms CPU per step"
                    for side in ("on", "off")
                )
                + f"; ratio {ratio:.3f}, CPU ratio {cpu_ratio:.3f}; hooks {100 * shares['wall'][-1]:.2f} % (wall), "
                f"{100 * shares['cpu'][-1]:.2f} % (CPU) of the on steps",
                flush=True,
            )
    tokens = {side: [statistics.mean(r.tokens.values()) for r in rs] for side, rs in runs.items()}
    summary = {
        "bench": "instrumentation",
        "pairs": pairs,
        "rl_steps": rl_steps,
        "warmup_steps": warmup,
        "ratio": spread(ratios),
        "cpu_ratio": spread(cpu_ratios),
        "hook_share_wall": spread(shares["wall"]),
        "hook_share_cpu": spread(shares["cpu"]),
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
        **{
            f"{side}_step_s": [statistics.median(r.step_s.values()) for r in rs]
            for side, rs in runs.items()
        },  # fmt: skip
        **{f"{side}_steady_steps": [len(r.step_s) for r in rs] for side, rs in runs.items()},
        **{f"{side}_tokens_per_step": t for side, t in tokens.items()},
    }
    r = summary["ratio"]
    print(
        f"RATIO instrumentation on/off RL step time over {pairs} pairs: median {r['median']:.3f} "
        f"(IQR {r['q1']:.3f} - {r['q3']:.3f}, min {r['min']:.3f}, max {r['max']:.3f}; "
        "goal <= 1.03)"
    )
    c = summary["cpu_ratio"]
    print(
        f"CPU RATIO instrumentation on/off process CPU seconds per RL step: median "
        f"{c['median']:.3f} (IQR {c['q1']:.3f} - {c['q3']:.3f}, min {c['min']:.3f}, "
        f"max {c['max']:.3f})"
    )
    for kind in ("wall", "cpu"):
        h = summary[f"hook_share_{kind}"]
        print(
            f"HOOKS {kind} seconds inside the instrumentation per on step: median "
            f"{100 * h['median']:.2f} % of the step (IQR {100 * h['q1']:.2f} - "
            f"{100 * h['q3']:.2f} %)"
        )
    by_hook = {
        name: [
            1e3 * statistics.mean(r.hook_by.get(name, (0.0, 0.0))[i] for r in runs["on"])
            for i in (0, 1)
        ]
        for name in hooks.names
    }
    summary["on_hook_ms_per_step_wall_cpu"] = by_hook
    print(
        "HOOKS ms per on step by hook, wall / CPU: "
        + ", ".join(f"{name} {w:.2f} / {c:.2f}" for name, (w, c) in by_hook.items())
    )
    print(
        f"WORK generated tokens per step, mean over runs: on {statistics.mean(tokens['on']):.0f}, "
        f"off {statistics.mean(tokens['off']):.0f}"
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
