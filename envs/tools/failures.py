"""A watch on tools that keep failing: a warning, once per tool, naming it and its first
traceback.

A tool that raises on some of its inputs is a bug in the environment, yet the run goes on
(the agent only sees ``error: ...``). :class:`ToolFailureMonitor` counts each tool's calls
and its own failures (an exception other than
:class:`~tunix_agentic.envs.tools.base.ToolError`, or a timeout) and logs a warning the
first time their share passes a threshold. The agent's mistakes (an unknown tool, bad
arguments, a refused call) never count against the tool. The per-run counts, by tool and
kind, are the agent loop's ``count/tool/<name>/error_total`` and ``count/tool/<name>/<kind>_total``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

_log = logging.getLogger("tunix_agentic.envs.tools")

TOOL_FAULTS = frozenset({"raised", "timeout"})


@dataclass
class ToolHealth:
    """One tool's calls so far: how many, how many failed by the tool's fault, the first
    such failure's traceback (or message), and whether it was warned about."""

    calls: int = 0
    failures: int = 0
    first_failure: str | None = None
    warned: bool = False

    @property
    def failure_share(self) -> float:
        return self.failures / self.calls if self.calls else 0.0


class ToolFailureMonitor:
    """Counts each tool's calls and failures; warns once per tool when, after at least
    ``min_calls`` calls, more than ``threshold`` of them failed by the tool's fault.

    Thread-safe (tools may be called from several loops). ``health`` gives the counts.
    """

    def __init__(self, *, threshold: float = 0.05, min_calls: int = 20):
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        if min_calls < 1:
            raise ValueError(f"min_calls must be >= 1, got {min_calls}")
        self.threshold, self.min_calls = threshold, min_calls
        self._lock = threading.Lock()
        self._tools: dict[str, ToolHealth] = {}

    def record(self, name: str, kind: str | None, detail: str | None = None) -> None:
        """Counts one finished call of tool ``name``: ``kind`` is the error kind of
        :class:`~tunix_agentic.envs.tools.ToolResult` (None: it succeeded), ``detail`` the
        traceback or message of a failure."""
        with self._lock:
            health = self._tools.setdefault(name, ToolHealth())
            health.calls += 1
            if kind in TOOL_FAULTS:
                health.failures += 1
                if health.first_failure is None:
                    health.first_failure = detail
            warn = (
                not health.warned
                and health.calls >= self.min_calls
                and health.failure_share > self.threshold
            )
            if warn:
                health.warned = True
                calls, failures, first = health.calls, health.failures, health.first_failure
        if warn:
            _log.warning(
                "tool %r failed in %d of its %d calls (%.0f%%, over the %.0f%% threshold): "
                "the agent only sees 'error: ...'. Fix the tool, or raise ToolError for "
                "inputs it refuses on purpose. Its first failure:\n%s",
                name,
                failures,
                calls,
                100.0 * failures / calls,
                100.0 * self.threshold,
                first,
            )

    def health(self) -> dict[str, ToolHealth]:
        """A copy of each tool's counts."""
        with self._lock:
            return {k: ToolHealth(**vars(v)) for k, v in self._tools.items()}

    def reset(self) -> None:
        """Forgets every count (and warning)."""
        with self._lock:
            self._tools.clear()


# The process's monitor, which call_tool reports to by default.
TOOL_FAILURES = ToolFailureMonitor()
