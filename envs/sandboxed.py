"""The base of environments whose episodes run code: one sandbox per episode.

A :class:`SandboxedEnv` starts its :class:`~tunix_agentic.envs.sandbox.Sandbox` in
``reset`` (the orchestrator's INIT stage, so a slow start never holds the
engine), records the start-up time in ``timings["sandbox_start"]`` (written to
TensorBoard as ``time/env/sandbox_start``), builds the episode's tools on it, and
closes tools and sandbox in ``close`` on every path. A sandbox that cannot start
raises from ``reset``: an infrastructure failure, retried or dropped, never a
reward of 0.

Its episodes run model-written code, so ``backend: auto`` fails closed here: without
a working bwrap, ``reset`` raises :class:`~tunix_agentic.envs.sandbox.SandboxError`
saying how to install it or opt out (``backend: process``, explicitly); see
:func:`~tunix_agentic.envs.sandbox.isolated`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from tunix_agentic.envs.base import Action, Environment, StepResult, run_tool_calls
from tunix_agentic.envs.sandbox import (
    Sandbox,
    SandboxConfig,
    bwrap_problem,
    isolated,
    unisolated_refusal,
)
from tunix_agentic.envs.tools import Tool


def sandbox_config(value: SandboxConfig | Mapping[str, Any] | None) -> SandboxConfig:
    """A :class:`SandboxConfig` from itself, a mapping of its fields (a config section) or
    None (the defaults)."""
    if isinstance(value, SandboxConfig):
        return value
    if value is None:
        return SandboxConfig()
    if not isinstance(value, Mapping):
        raise ValueError(f"sandbox must be a SandboxConfig or a mapping, got {value!r}")
    return SandboxConfig(**dict(value))


def check_isolation(config: SandboxConfig) -> None:
    """Raises :class:`~tunix_agentic.envs.sandbox.SandboxError`, saying how to fix it, when
    model-written code could not run isolated in ``config``'s sandboxes here: bwrap cannot
    run and ``config.backend`` is not an explicit ``"process"``. A start-up check for a
    trainer or server (each episode's ``reset`` makes it too); the first call probes bwrap
    (blocking: call it off the event loop)."""
    if isolated(config).backend == "bwrap" and (problem := bwrap_problem()) is not None:
        raise unisolated_refusal(problem)


class SandboxedEnv(Environment):
    """An environment with a sandbox per episode; subclasses build their tools in
    :meth:`make_tools` and prepare the sandbox in :meth:`setup`, and list the tools'
    classes in ``tool_types`` (their schemas are the environment's before an episode
    has built its tools, e.g. for demonstrations).

    ``tool_timeout`` bounds one tool call (the tool's own limit; :func:`call_tool`
    cancels a little later as a backstop).
    """

    def __init__(
        self,
        *,
        sandbox: SandboxConfig | Mapping[str, Any] | None = None,
        tool_timeout: float = 30.0,
    ) -> None:
        super().__init__()
        if not tool_timeout > 0:
            raise ValueError(f"tool_timeout must be positive, got {tool_timeout}")
        self.sandbox_config = isolated(sandbox_config(sandbox))  # every sandbox it makes
        self.tool_timeout = float(tool_timeout)
        self.sandbox: Sandbox | None = None
        self.tools: dict[str, Tool] = {}
        self.timings: dict[str, float] = {}

    tool_types: tuple[type[Tool], ...] = ()

    def tool_schemas(self) -> list[dict[str, Any]]:
        if self.tools:
            return super().tool_schemas()
        return [t.schema() for t in self.tool_types]

    def make_tools(self, sandbox: Sandbox) -> dict[str, Tool]:
        """The episode's tools on ``sandbox`` (default: none)."""
        return {}

    async def setup(self, task: Any, sandbox: Sandbox) -> None:  # noqa: B027 - optional hook
        """Prepares ``sandbox`` for ``task`` (write files, install fixtures); default nothing."""

    async def start(self, task: Any) -> Sandbox:
        """Closes what a previous episode left, starts this episode's sandbox and tools."""
        await self.close()
        await asyncio.get_running_loop().run_in_executor(None, check_isolation, self.sandbox_config)
        self.sandbox = await Sandbox.create(self.sandbox_config)
        self.timings = {"sandbox_start": self.sandbox.start_s}
        await self.setup(task, self.sandbox)
        self.tools = self.make_tools(self.sandbox)
        return self.sandbox

    async def run_tools(self, action: Action) -> StepResult:
        """The action's tool calls (and parse errors) run in order, as observations."""
        return await run_tool_calls(self.tools, action, timeout=self.tool_timeout + 5.0)

    async def close(self) -> None:
        """Closes the tools (their shells and interpreters), then the sandbox; idempotent."""
        tools, self.tools = self.tools, {}
        sandbox, self.sandbox = self.sandbox, None
        try:
            for tool in tools.values():
                close = getattr(tool, "close", None)
                if close is not None:
                    await close()
        finally:
            if sandbox is not None:
                await sandbox.close()
