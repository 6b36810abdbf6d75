"""The machine's state beside a measurement: load average, the CPU time other processes
used, and each side's thread settings; and the guard that keeps a pair measured on a busy
machine out of a comparison.

Host-side, standard library only (no JAX, no torch): ``profiling/`` (``compare_peers``,
``bench_learner``, ``bench_rl_workload``) and ``tunix-agentic compare`` share it.

Other processes' CPU time over a window is the machine's non-idle time from
``/proc/stat`` less this process tree's own, from ``/proc/self/stat``: ``utime + stime``
(every thread of this process) plus ``cutime + cstime`` (children this process has waited
for). A peer run through ``subprocess.run`` is waited for before the window closes, so its
time counts as ours; anything else on the machine, including processes that started and
ended inside the window, counts as others'. Summing other processes' ``/proc/PID/stat``
instead would miss those short-lived ones (a test run, a compiler), which are exactly the
load that spoils a pair. A grandchild a peer leaves running unwaited would count as
others' too, which errs on the side of calling the machine busy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from typing import Any

BUSY_SUMMARY = "machine busy: not a comparison"
# Environment variables that set a side's thread pools: OpenMP (torch's intra-op pool),
# MKL, and NPROC, which XLA's CPU client reads for its intra-op pool size.
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "OMP_PROC_BIND",
    "GOMP_SPINCOUNT",
    "KMP_BLOCKTIME",
    "MKL_NUM_THREADS",
    "NPROC",
    "XLA_FLAGS",
)
THREADS_MARKER = "THREADS "  # a peer script's line: THREADS {json}
WAIT_POLICIES = ("passive", "active", "default")


# ------------------------------------------------------------------ /proc
def clock_ticks() -> int:
    """Ticks per second of /proc's CPU times (USER_HZ)."""
    return os.sysconf("SC_CLK_TCK")


def busy_ticks(proc_stat: str) -> int:
    """Non-idle ticks of all CPUs from /proc/stat's ``cpu`` line: user, nice, system,
    irq, softirq, steal (guest time is already inside user; idle and iowait are idle)."""
    for line in proc_stat.splitlines():
        if line.startswith("cpu "):
            f = [int(x) for x in line.split()[1:]]
            f += [0] * (8 - len(f))
            user, nice, system, _idle, _iowait, irq, softirq, steal = f[:8]
            return user + nice + system + irq + softirq + steal
    raise ValueError("/proc/stat has no aggregate 'cpu ' line")


def own_ticks(self_stat: str) -> int:
    """This process's ticks from /proc/self/stat: utime + stime + cutime + cstime (fields
    14-17; counted after the command name's closing parenthesis, which may hold spaces)."""
    rest = self_stat[self_stat.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): fields 14..17 are rest[11..14].
    return sum(int(x) for x in rest[11:15])


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
    """CPU counters at one instant (seconds)."""

    wall: float  # time.monotonic()
    machine_busy_s: float  # every CPU's non-idle time since boot
    own_s: float  # this process and its waited-for children
    load1: float

    @classmethod
    def now(cls) -> CpuSnapshot:
        hz = clock_ticks()
        return cls(
            wall=time.monotonic(),
            machine_busy_s=busy_ticks(_read("/proc/stat")) / hz,
            own_s=own_ticks(_read("/proc/self/stat")) / hz,
            load1=os.getloadavg()[0],
        )


def machine_name() -> str:
    """``N CPUs, <model name>`` from /proc/cpuinfo (the model left out where unknown)."""
    model = ""
    try:
        for line in _read("/proc/cpuinfo").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu_count()} CPUs" + (f", {model}" if model else "")


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask), as XLA and OpenMP count them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class MachineState:
    """What the machine did over one window (a pair, a side's run).

    ``other_cpu_s``: CPU seconds processes outside this tree used; ``other_share``: that
    over the window's CPU capacity (wall seconds x CPUs), 0.25 = a quarter of the machine.
    """

    wall_s: float
    cpus: int
    own_cpu_s: float
    other_cpu_s: float
    load_start: float
    load_end: float

    @classmethod
    def between(cls, a: CpuSnapshot, b: CpuSnapshot, cpus: int | None = None) -> MachineState:
        own = max(0.0, b.own_s - a.own_s)
        # Tick rounding on both counters can make a quiet window a hair negative.
        other = max(0.0, (b.machine_busy_s - a.machine_busy_s) - own)
        return cls(
            wall_s=max(0.0, b.wall - a.wall),
            cpus=cpus or cpu_count(),
            own_cpu_s=own,
            other_cpu_s=other,
            load_start=a.load1,
            load_end=b.load1,
        )

    @property
    def other_share(self) -> float:
        capacity = self.wall_s * self.cpus
        return self.other_cpu_s / capacity if capacity > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "wall_s": round(self.wall_s, 3),
            "cpus": self.cpus,
            "own_cpu_s": round(self.own_cpu_s, 3),
            "other_cpu_s": round(self.other_cpu_s, 3),
            "other_share": round(self.other_share, 4),
            "load_start": round(self.load_start, 2),
            "load_end": round(self.load_end, 2),
        }

    def describe(self) -> str:
        return (
            f"others used {100 * self.other_share:.0f}% of {self.cpus} CPUs "
            f"({self.other_cpu_s:.1f} CPU-s in {self.wall_s:.1f} s), load "
            f"{self.load_start:.2f}->{self.load_end:.2f}"
        )


class Window:
    """``with Window() as w: ...`` then ``w.state``: the machine's state over the block."""

    state: MachineState | None = None

    def __enter__(self) -> Window:
        self._start = CpuSnapshot.now()
        return self

    def __exit__(self, *exc) -> None:
        self.state = MachineState.between(self._start, CpuSnapshot.now())


# ------------------------------------------------------------------ guard
@dataclasses.dataclass(frozen=True)
class BusyGuard:
    """When a pair does not count, and when a comparison does not stand.

    A pair is busy when processes other than the benchmark's used more than
    ``max_other_share`` of the machine's CPUs while it ran; busy pairs are left out of the
    median. With fewer than ``min_clean_pairs`` clean pairs left (or fewer than were
    requested, if that is less) and at least one busy, the comparison is
    :data:`BUSY_SUMMARY`, and no ratio stands as its result.
    """

    max_other_share: float = 0.10
    min_clean_pairs: int = 2

    def __post_init__(self):
        if not 0 < self.max_other_share <= 1:
            raise ValueError(f"max_other_share must be in (0, 1], got {self.max_other_share}")
        if self.min_clean_pairs < 1:
            raise ValueError(f"min_clean_pairs must be >= 1, got {self.min_clean_pairs}")

    def is_busy(self, state: MachineState) -> bool:
        return state.other_share > self.max_other_share

    def needed(self, requested: int) -> int:
        """Clean pairs a comparison of ``requested`` pairs needs to stand."""
        return max(1, min(self.min_clean_pairs, requested))

    def stands(self, clean: int, busy: int, requested: int) -> bool:
        """Whether a comparison with ``clean`` and ``busy`` pairs gives a result (a lack of
        pairs for other reasons, a side printing no figure, is not a busy machine)."""
        return busy == 0 or clean >= self.needed(requested)

    def describe(self) -> str:
        return (
            f"a pair is left out when other processes used more than "
            f"{100 * self.max_other_share:g}% of the CPUs during it; {self.min_clean_pairs} "
            f"clean pairs needed"
        )


# ---------------------------------------------------------------- threads
@dataclasses.dataclass(frozen=True)
class ThreadSettings:
    """One side's thread settings: its intra-op threads (None: not known), where that
    figure comes from, and the thread-related environment it ran with."""

    side: str
    intra_op: int | None
    source: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "intra_op": self.intra_op,
            "source": self.source,
            "env": dict(self.env),
            **dict(self.extra),
        }

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items() if k != "XLA_FLAGS")
        return f"{self.side}: {self.intra_op} intra-op threads ({self.source}){' ' + env if env else ''}"


def thread_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in THREAD_ENV if k in environ}


def running_threads(name: str) -> int:
    """Threads of this process named ``name`` (``/proc/self/task/*/comm``)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            count += _read(f"/proc/self/task/{task}/comm").strip() == name
        except OSError:  # the thread ended meanwhile
            continue
    return count


def xla_threads(environ: Mapping[str, str] | None = None) -> ThreadSettings:
    """XLA's CPU intra-op pool: for this process once JAX has computed, its running
    ``tf_XLAEigen`` threads counted; else as XLA's client sizes it, ``NPROC`` when set,
    else the CPUs in the affinity mask (``--xla_cpu_multi_thread_eigen=false`` in
    XLA_FLAGS makes it one)."""
    if environ is None:
        running = running_threads("tf_XLAEigen")
        if running:
            return ThreadSettings("jax", running, "running tf_XLAEigen threads", thread_env())
        environ = os.environ
    env = thread_env(environ)
    if "--xla_cpu_multi_thread_eigen=false" in environ.get("XLA_FLAGS", ""):
        return ThreadSettings("jax", 1, "XLA_FLAGS multi_thread_eigen=false", env)
    nproc = environ.get("NPROC", "")
    if nproc.isdigit() and int(nproc) > 0:
        return ThreadSettings("jax", int(nproc), "NPROC", env)
    return ThreadSettings("jax", cpu_count(), "CPU affinity", env)


def peer_env(threads: int | None, wait_policy: str = "default") -> dict[str, str]:
    """The environment for a peer's process: ``threads`` intra-op threads on both runtimes
    (``OMP_NUM_THREADS`` for torch, ``NPROC`` for XLA; None: each runtime's default) and
    OpenMP's wait policy (``passive``: idle OpenMP threads sleep instead of spinning, which
    on a shared machine keeps torch's threads from burning the cores they wait on;
    ``default``: leave it unset). Read at the runtime's start, so it is set here, for a
    fresh process, never after torch is imported."""
    if wait_policy not in WAIT_POLICIES:
        raise ValueError(
            f"wait_policy must be one of {', '.join(WAIT_POLICIES)}, got {wait_policy!r}"
        )
    env: dict[str, str] = {}
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), NPROC=str(threads))
    if wait_policy != "default":
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    return env


def threads_line(settings: ThreadSettings) -> str:
    """The line a peer script prints so the caller can read its thread settings back."""
    return THREADS_MARKER + json.dumps(settings.to_dict())


def parse_threads(output: str) -> dict[str, Any] | None:
    """The last ``THREADS {json}`` line of a process's output (None when it printed none)."""
    found = None
    for line in output.splitlines():
        if line.startswith(THREADS_MARKER):
            try:
                found = json.loads(line[len(THREADS_MARKER) :])
            except json.JSONDecodeError:
                continue
    return found
