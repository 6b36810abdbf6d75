"""The learner bounds its own memory: a train step that would not fit is split into
smaller micro-batches before it runs, never left to the allocator or the kernel.

XLA knows, once a step is compiled, how much memory the step needs beyond the state it
is given (its temporaries and the outputs it does not write in place:
:func:`step_bytes`). :func:`free_bytes` is what the learner's devices have left: a
GPU's or TPU's allocator limit less what it holds, or on CPU the host's available
memory. Agents from frameworks that re-send long system prompts make one long row per
call (hundreds of rows of thousands of tokens); at a fixed ``micro_batch_rows`` such a
batch asked XLA for 60 GB. :func:`fit_micro_batch` halves the micro-batch until the
compiled step fits (the update is the same: micro-batches add up to the whole batch),
and when even the smallest does not fit, raises :class:`StepTooLarge` naming the
batch's shape, the need, what is free and the settings that shrink it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

_log = logging.getLogger(__name__)

# Of what is free, what a step may take: the rest is for what runs beside it (the
# engine's KV cache and its compiles, the host's other work) and the allocator's slack.
FREE_SHARE = 0.85


class StepTooLarge(MemoryError):
    """A train step that does not fit even at the smallest micro-batch."""


def free_bytes(devices: Sequence[Any]) -> int | None:
    """What the least-free of ``devices`` has left: an accelerator's allocator limit less
    what it holds, or (CPU) the host's ``MemAvailable``; None when unknown."""
    free = []
    for device in devices:
        stats = None
        if device.platform != "cpu":
            try:
                stats = device.memory_stats()
            except Exception:  # a backend without statistics: unknown
                stats = None
        if stats and "bytes_limit" in stats:
            free.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
        elif device.platform == "cpu":
            host = host_available_bytes()
            if host is None:
                return None
            free.append(host)
        else:
            return None
    return min(free) if free else None


def host_available_bytes() -> int | None:
    """Linux's estimate of the memory a new allocation can take without swapping."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def step_bytes(compiled: Any) -> int | None:
    """The memory a compiled step takes beyond its arguments: temporaries, and outputs not
    written over a donated argument (XLA's memory analysis; None without one)."""
    try:
        mem = compiled.memory_analysis()
    except Exception:  # a backend without the analysis: unknown
        return None
    if mem is None:
        return None
    extra = int(mem.output_size_in_bytes) - int(mem.alias_size_in_bytes)
    return int(mem.temp_size_in_bytes) + max(extra, 0)


def micro_batch_sizes(start: int, multiple: int) -> list[int]:
    """The micro-batch sizes to try, largest first: ``start``, then halved (each rounded up
    to ``multiple``, the mesh's row granularity) down to ``multiple``."""
    sizes, size = [start], start
    while size > multiple:
        size = max(multiple, -(-(size // 2) // multiple) * multiple)
        if size < sizes[-1]:
            sizes.append(size)
    return sizes


def fit_micro_batch(
    compile_for: Callable[[int], Any],
    *,
    rows: int,
    width: int,
    start: int,
    multiple: int,
    free: int | None,
) -> tuple[int, Any]:
    """The largest micro-batch, from ``start`` down (:func:`micro_batch_sizes`), whose
    compiled step (``compile_for(micro)``) needs at most :data:`FREE_SHARE` of ``free``,
    and that step. With ``free`` None (unknown), ``start`` as it is."""
    budget = None if free is None else int(free * FREE_SHARE)
    need = None
    for micro in micro_batch_sizes(start, multiple):
        compiled = compile_for(micro)
        need = step_bytes(compiled)
        if budget is None or need is None or need <= budget:
            if micro < start:
                _log.warning(
                    "learner: a train step of %d rows x %d tokens at micro-batches of %d rows "
                    "does not fit the memory free (%.2f GiB); running micro-batches of %d "
                    "rows (%.2f GiB; learner.micro_batch_rows sets the first size tried)",
                    rows,
                    width,
                    start,
                    (free or 0) / 2**30,
                    micro,
                    need / 2**30 if need is not None else float("nan"),
                )
            return micro, compiled
    raise StepTooLarge(
        f"the learner's train step on {rows} rows x {width} tokens needs "
        f"{need / 2**30:.2f} GiB even at micro-batches of {multiple} row(s), more than the "
        f"{budget / 2**30:.2f} GiB it may take ({FREE_SHARE:.0%} of {free / 2**30:.2f} GiB "
        "free): shorten the rows (engine.max_seq_len, agent.max_turns, a context window), "
        "turn on learner.remat, or train LoRA adapters (learner.lora.rank)"
    )
