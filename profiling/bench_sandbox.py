"""Sandbox start-up and tool-call latency, printed, never asserted.

For each backend (bwrap, and the process fallback): sandboxes started per second one after
another and ``--concurrency`` at a time (each start is ``Sandbox.create`` plus a first
command, ``true``, then ``close``), the p50/p95 of ``sandbox.start_s`` and of start plus
first command, then the p50/p95 latency of each tool on one warm sandbox: ``bash``
(``echo hi``), ``python`` (``print(1)``) and ``file_edit`` (``view`` of a 50-line file), and
what the first call of a tool costs (it starts the shell or the interpreter).

    python -m profiling.bench_sandbox
    BENCH_STARTS=200 BENCH_CONCURRENCY=32 python -m profiling.bench_sandbox

Environment: BENCH_STARTS (60), BENCH_CONCURRENCY (16), BENCH_CALLS (50),
BENCH_BACKENDS (bwrap,process).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import time
import warnings
from typing import Any

from profiling.common import env_int, percentiles
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig, SandboxIsolationWarning
from tunix_agentic.envs.tools import BashTool, FileEditTool, PythonTool


@dataclasses.dataclass(frozen=True)
class SandboxBenchParams:
    starts: int = 60
    concurrency: int = 16
    calls: int = 50
    backends: tuple[str, ...] = ("bwrap", "process")


@dataclasses.dataclass
class BackendResult:
    backend: str
    seq_per_s: float
    conc_per_s: float
    start_p50_ms: float
    start_p95_ms: float
    first_cmd_p50_ms: float  # start + the first command (``true``)
    first_cmd_p95_ms: float
    close_p50_ms: float
    tool_ms: dict[str, dict[str, float]]  # tool -> {"first", "p50", "p95"}

    def lines(self, p: SandboxBenchParams) -> list[str]:
        out = [
            f"RESULT sandbox[{self.backend}]: {self.seq_per_s:.1f} starts/s sequential, "
            f"{self.conc_per_s:.1f} starts/s with {p.concurrency} concurrent "
            f"(start+first command+close); start_s p50 {self.start_p50_ms:.1f} ms "
            f"p95 {self.start_p95_ms:.1f} ms; start+first command p50 "
            f"{self.first_cmd_p50_ms:.1f} ms p95 {self.first_cmd_p95_ms:.1f} ms; "
            f"close p50 {self.close_p50_ms:.1f} ms",
        ]
        for tool, f in self.tool_ms.items():
            out.append(
                f"RESULT tool[{self.backend}] {tool}: p50 {f['p50']:.1f} ms, p95 {f['p95']:.1f} "
                f"ms over {p.calls} calls; first call {f['first']:.1f} ms"
            )
        return out


async def _one_start(cfg: SandboxConfig) -> tuple[float, float, float]:
    """(start_s, start + first command, close) in seconds."""
    t0 = time.perf_counter()
    sb = await Sandbox.create(cfg)
    result = await sb.run("true")
    first = time.perf_counter() - t0
    if result.exit_code != 0:
        raise RuntimeError(f"the sandbox's first command failed: {result.output}")
    t1 = time.perf_counter()
    await sb.close()
    return float(sb.start_s or 0.0), first, time.perf_counter() - t1


async def _tool_latencies(cfg: SandboxConfig, calls: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    async with Sandbox(cfg) as sb:
        sb.write_file("data.txt", "".join(f"line {i}\n" for i in range(50)))
        cases: list[tuple[str, Any, dict[str, Any], str]] = [
            ("bash", BashTool(sb), {"command": "echo hi"}, "hi"),
            ("python", PythonTool(sb, max_calls=calls + 1), {"code": "print(1)"}, "1"),
            ("file_edit", FileEditTool(sb), {"command": "view", "path": "data.txt"}, "line 49"),
        ]
        for name, tool, args, expect in cases:
            times = []
            for _ in range(calls + 1):
                t = time.perf_counter()
                text = await tool.run(**args)
                times.append(time.perf_counter() - t)
                if expect not in text:
                    raise RuntimeError(f"{name} answered {text!r}")
            q = percentiles(times[1:], (50, 95))
            out[name] = {"first": times[0] * 1e3, "p50": q["p50"] * 1e3, "p95": q["p95"] * 1e3}
    return out


async def bench_backend(backend: str, p: SandboxBenchParams) -> BackendResult:
    cfg = SandboxConfig(backend=backend)
    await _one_start(cfg)  # the bwrap probe and the imports, outside the timings
    t0 = time.perf_counter()
    seq = [await _one_start(cfg) for _ in range(p.starts)]
    seq_s = time.perf_counter() - t0
    conc: list[tuple[float, float, float]] = []
    t0 = time.perf_counter()
    while len(conc) < p.starts:
        n = min(p.concurrency, p.starts - len(conc))
        conc += await asyncio.gather(*(_one_start(cfg) for _ in range(n)))
    conc_s = time.perf_counter() - t0
    start = percentiles([s for s, _, _ in seq], (50, 95))
    first = percentiles([f for _, f, _ in seq], (50, 95))
    close = percentiles([c for _, _, c in seq], (50,))
    return BackendResult(
        backend=backend,
        seq_per_s=p.starts / seq_s,
        conc_per_s=p.starts / conc_s,
        start_p50_ms=start["p50"] * 1e3,
        start_p95_ms=start["p95"] * 1e3,
        first_cmd_p50_ms=first["p50"] * 1e3,
        first_cmd_p95_ms=first["p95"] * 1e3,
        close_p50_ms=close["p50"] * 1e3,
        tool_ms=await _tool_latencies(cfg, p.calls),
    )


def parse_args(argv: list[str] | None) -> SandboxBenchParams:
    d = SandboxBenchParams()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=env_int("BENCH_STARTS", d.starts))
    ap.add_argument("--concurrency", type=int, default=env_int("BENCH_CONCURRENCY", d.concurrency))
    ap.add_argument("--calls", type=int, default=env_int("BENCH_CALLS", d.calls))
    ap.add_argument("--backends", default=os.environ.get("BENCH_BACKENDS", ",".join(d.backends)))
    a = ap.parse_args(argv)
    backends = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    return SandboxBenchParams(
        starts=a.starts, concurrency=a.concurrency, calls=a.calls, backends=backends
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the sandbox benchmark; returns the figures it printed, by backend."""
    p = parse_args(argv)
    figures: dict[str, Any] = {}
    print(f"sandbox benchmark: {os.cpu_count()} CPUs, uid {os.geteuid()}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxIsolationWarning)  # the process backend's
        for backend in p.backends:
            result = asyncio.run(bench_backend(backend, p))
            for line in result.lines(p):
                print(line)
            figures[backend] = dataclasses.asdict(result)
    return figures


if __name__ == "__main__":
    main()
