"""A watch on tools that keep failing: a warning, once per tool, naming it and its first
traceback; and one when most of a tool's calls are refused for their arguments.

A tool that raises on some of its inputs is a bug in the environment, yet the run goes on
(the agent only sees ``error: ...``). :class:`ToolFailureMonitor` counts each tool's calls
and its own failures (an exception other than
:class:`~tunix_agentic.envs.tools.base.ToolError`, or a timeout) and logs a warning the
first time their share passes a threshold. The agent's mistakes (an unknown tool, bad
arguments, a refused call) never count against the tool, but a tool whose calls mostly
fail its own schema (``bad_arguments``) gets a warning of its own, with the first such
call's error: a schema that disagrees with what the model was shown (the demonstrations,
the tools prompt) looks like this, and the run would otherwise learn nothing quietly. The per-run counts, by tool and
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
    bad_arguments: int = 0
    first_bad_arguments: str | None = None
    warned_arguments: bool = False

    @property
    def failure_share(self) -> float:
        return self.failures / self.calls if self.calls else 0.0


class ToolFailureMonitor:
    """Counts each tool's calls and failures; warns once per tool when, after at least
    ``min_calls`` calls, more than ``threshold`` of them failed by the tool's fault, and
    once when more than ``arguments_threshold`` of them failed its schema.

    Thread-safe (tools may be called from several loops). ``health`` gives the counts.
    """

    def __init__(
        self, *, threshold: float = 0.05, min_calls: int = 20, arguments_threshold: float = 0.5
    ):
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        if not 0.0 <= arguments_threshold < 1.0:
            raise ValueError(f"arguments_threshold must be in [0, 1), got {arguments_threshold}")
        if min_calls < 1:
            raise ValueError(f"min_calls must be >= 1, got {min_calls}")
        self.threshold, self.min_calls = threshold, min_calls
        self.arguments_threshold = arguments_threshold
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
            elif kind == "bad_arguments":
                health.bad_arguments += 1
                if health.first_bad_arguments is None:
                    health.first_bad_arguments = detail
            warn_arguments = (
                not health.warned_arguments
                and health.calls >= self.min_calls
                and health.bad_arguments / health.calls > self.arguments_threshold
            )
            if warn_arguments:
                health.warned_arguments = True
                bad, first_bad = health.bad_arguments, health.first_bad_arguments
            warn = (
                not health.warned
                and health.calls >= self.min_calls
                and health.failure_share > self.threshold
            )
            if warn:
                health.warned = True
                calls, failures, first = health.calls, health.failures, health.first_failure
            total = health.calls
        if warn_arguments:
            _log.warning(
                "tool %r refused %d of its %d calls for their arguments (%.0f%%, over the "
                "%.0f%% threshold): does its schema match what the model was shown (the "
                "demonstrations, the tools prompt)? The first: %s",
                name,
                bad,
                total,
                100.0 * bad / total,
                100.0 * self.arguments_threshold,
                first_bad,
            )
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
