"""Ahead-of-time compilation of every shape an engine meets: its warm-up.

:class:`Warmup` compiles, from shapes alone, every prefill shape (row bucket x length
bucket) and the decode chunk at every window bucket of an engine's config, so a request
whose shape was compiled starts without a compile pause. It reads no engine state, so it
runs on a thread of its own beside the serving scheduler (``EngineConfig.warmup: true``
starts it as the engine is built) or beside other work (the trainer's SFT warm start);
a stop between two shapes leaves the rest to compile when first met.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import numpy as np

from tunix_agentic.inference.config import EngineConfig
from tunix_agentic.inference.device_step import PrefillBatch, RowSampling


class Warmup:
    """One engine's warm-up: ``run`` compiles now, ``start`` on a background thread (once),
    ``stop`` ends it after the shape under way."""

    def __init__(self, config: EngineConfig, scheduler: Any, device_specs: tuple[Any, ...]):
        self.config, self._scheduler, self._specs = config, scheduler, device_specs
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.future: concurrent.futures.Future | None = None

    def run(self) -> dict[str, float]:
        """Compile every shape now; the shapes compiled and the seconds."""
        t = time.perf_counter()
        cfg, sched = self.config, self._scheduler
        shape = {} if sched.paged is None else sched.paged.batch_shape
        n = 0
        for length in cfg.length_buckets():
            for rows in cfg.row_buckets():
                if self._stop.is_set():  # the engine closed meanwhile: leave the rest
                    return {"shapes": n, "seconds": time.perf_counter() - t}
                batch = PrefillBatch.host(
                    rows, length, num_slots=cfg.max_slots, max_seq_len=cfg.max_seq_len, **shape
                )
                with sched.compiles.counting("prefill"):
                    sched.prefill_jit.lower(*self._specs, batch).compile()
                n += 1
        s = cfg.max_slots
        for window in cfg.window_buckets():
            if self._stop.is_set():
                break
            with sched.compiles.counting("decode"):
                sched.decode_jit.lower(
                    *self._specs,
                    np.zeros(s, bool),
                    RowSampling.host(s),
                    np.zeros((s, shape.get("table_width", 0)), np.int32),
                    window,
                ).compile()
            n += 1
        return {"shapes": n, "seconds": time.perf_counter() - t}

    def start(self) -> concurrent.futures.Future:
        """:meth:`run` on a background thread, once; the future resolves with its result."""
        with self._lock:
            if self.future is None:
                fut: concurrent.futures.Future = concurrent.futures.Future()

                def run() -> None:
                    try:
                        fut.set_result(self.run())
                    except BaseException as exc:  # whoever waits on the future sees it
                        fut.set_exception(exc)

                threading.Thread(target=run, name="engine-warmup", daemon=True).start()
                self.future = fut
        return self.future

    def stop(self, timeout: float) -> None:
        """No shape after the one under way; waits up to ``timeout`` for a started run."""
        self._stop.set()
        if self.future is not None:
            concurrent.futures.wait([self.future], timeout)
