"""The agent loop: model turn, parse, environment step, until done.

Runs the RUN stage of one episode. Never raises for what the policy does (a
malformed call is an observation, running out of turns or tokens is a
status); infrastructure faults (engine or environment raising) end the episode
with an infra status so the orchestrator keeps them out of group statistics.

A turn runs at most ``agent.max_tool_calls_per_turn`` tool calls (see
:func:`cap_tool_calls`), and the time the environment spends on the agent's
actions (:meth:`Environment.step`, a step cut off by the episode deadline
included) is summed in ``traj.timings["actions_s"]``: the orchestrator reads it
to tell a timeout the agent ran into from one of the machinery
(:func:`tunix_agentic.trajectory.timeout_status`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from tunix_agentic.agent.chat import TOOLS_FALLBACKS, ChatFormat, ToolsFallback
from tunix_agentic.agent.context import context_rule_for, get_context_rule
from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.envs.base import Action, Environment
from tunix_agentic.envs.tools import ToolUnavailable
from tunix_agentic.envs.tools.base import STEP_CALLS
from tunix_agentic.inference.base import InferenceEngine, PromptTooLongError
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.metrics.sink import NULL_METRICS, MetricsSink
from tunix_agentic.trajectory import Step, Trajectory


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    # Model turns per episode; then it ends with status "max_turns" (rollout.max_turns_schedule
    # changes it by policy version).
    max_turns: int = 4
    # Tokens one turn may generate; a turn cut there ends the episode ("max_tokens").
    max_new_tokens: int = 96
    # Sampling temperature; 0: greedy. Above 0 it must equal learner.temperature.
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus sampling's mass, in (0, 1]; 1: off
    top_k: int = 0  # sample among the k likeliest tokens; 0: off; at most model.vocab_size
    # Tool-call format by name (agent/tool_parser.py): "qwen3" (<tool_call>{json}</tool_call>,
    # <answer>...</answer>) is built in; tool_parser.register_parser adds more.
    parser: str = "qwen3"
    # What each model call sees (agent/context.py): "append_only" the whole history,
    # "sliding_window" the prompt and the last context_window steps, "as_rendered" the
    # history as a server re-rendering the conversation shows it (see enable_thinking).
    context_rule: str = "append_only"
    # Steps of history the "sliding_window" context rule keeps after the prompt.
    context_window: int = 2
    # Passed to a Hugging Face chat template as ``enable_thinking`` (Qwen3 reads it: false
    # renders an empty <think></think> so the model answers at once); None: not passed.
    # With false every earlier turn keeps that 4-token empty block in the engine's context,
    # which a serving stack re-rendering the conversation drops: context_rule="as_rendered"
    # trains on (and samples from) the contexts as such a deployment renders them.
    enable_thinking: bool | None = None
    # A chat template that drops the tool schemas (SmolLM2's): "system" lists them in the
    # system prompt (tools_prompt, "" for chat.DEFAULT_TOOLS_PROMPT; "{tools}" marks where
    # the schemas go), "error" refuses the template at start, "drop" leaves them out, "auto"
    # is "drop" for the built-in character template and "system" otherwise.
    tools_fallback: ToolsFallback = "auto"
    # The system-prompt text that lists the tools when tools_fallback is (or "auto" picks)
    # "system"; "{tools}" marks where the schemas go; "": chat.DEFAULT_TOOLS_PROMPT.
    tools_prompt: str = ""
    # Tool calls one turn may run; the rest are not run and the agent is told so (a turn of
    # many slow calls would otherwise outlast the episode's deadline in one step).
    max_tool_calls_per_turn: int = 8

    def template_kwargs(self) -> dict:
        """Extra variables for a Jinja chat template."""
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}

    def template_options(self) -> dict:
        """Keyword arguments of :func:`~tunix_agentic.agent.chat.make_chat_template`."""
        return {
            "kwargs": self.template_kwargs(),
            "tools_fallback": self.tools_fallback,
            "tools_prompt": self.tools_prompt or None,
        }

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError(f"agent.max_turns must be >= 1, got {self.max_turns}")
        if self.max_new_tokens < 1:
            raise ValueError(f"agent.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.context_window < 1:
            raise ValueError(f"agent.context_window must be >= 1, got {self.context_window}")
        if self.max_tool_calls_per_turn < 1:
            raise ValueError(
                f"agent.max_tool_calls_per_turn must be >= 1, got {self.max_tool_calls_per_turn}"
            )
        if self.tools_fallback not in TOOLS_FALLBACKS:
            raise ValueError(
                f"agent.tools_fallback must be one of {TOOLS_FALLBACKS}, got {self.tools_fallback!r}"
            )
        if self.tools_prompt and "{tools}" not in self.tools_prompt:
            raise ValueError("agent.tools_prompt must contain '{tools}' (where the schemas go)")
        for key, lookup in (("parser", get_parser), ("context_rule", get_context_rule)):
            try:
                lookup(getattr(self, key))
            except ValueError as exc:
                raise ValueError(f"agent.{key}: {exc}") from None
        try:  # the values an engine must honour, checked once here instead of per request
            SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        except ValueError as exc:
            raise ValueError(f"agent.{exc}") from None

    def sampling(
        self, stop_token_ids: tuple[int, ...], *, seed: int | None, turn: int
    ) -> SamplingParams:
        """Sampling for one turn; an episode seed gives each turn its own reproducible seed."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=stop_token_ids,
            seed=None if seed is None else (seed * 1009 + turn) % 2**63,
        )


def cap_tool_calls(action: Action, cap: int) -> Action:
    """``action`` with at most ``cap`` tool calls: the first ``cap`` are kept, and for the
    rest one message joins ``parse_errors`` (the environment reports it as an ``error:``
    observation after the calls' outputs). Malformed calls do not count: they never run."""
    calls = action.tool_calls
    if len(calls) <= cap:
        return action
    message = (
        f"this turn made {len(calls)} tool calls; only the first {cap} were run (at most "
        f"{cap} per turn) and the other {len(calls) - cap} were not"
    )
    return dataclasses.replace(
        action, tool_calls=calls[:cap], parse_errors=(*action.parse_errors, message)
    )


async def run_agent(
    engine: InferenceEngine,
    env: Environment,
    traj: Trajectory,
    template: ChatFormat,
    config: AgentConfig,
    *,
    seed: int | None = None,
    max_turns: int | None = None,
    metrics: MetricsSink = NULL_METRICS,
) -> Trajectory:
    """Play turns until the environment says done; fills ``traj`` in place.

    ``traj`` already holds the prompt ids (from the INIT stage). ``seed``
    seeds each turn's sampling (seed + turn), so an episode is reproducible.
    Each environment step's seconds are added to ``traj.timings["actions_s"]`` even
    when the step is cancelled (the episode's deadline).
    """
    parse = get_parser(config.parser)
    context_of = context_rule_for(config.context_rule, template)
    tokenizer = template.tokenizer
    turns = max_turns or config.max_turns
    for turn in range(turns):
        context = context_of(traj, config.context_window)
        # The whole history (the usual case) is not copied into the step.
        whole = len(context) == len(traj.token_ids) and context == traj.token_ids
        sampling = config.sampling(template.stop_ids, seed=seed, turn=turn)
        t0 = time.perf_counter()
        try:
            out = await engine.generate(context, sampling, session_id=traj.episode_id)
        except PromptTooLongError:
            traj.status = "max_tokens"
            return traj
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine's fault, not the policy's
            traj.status, traj.error = "engine_error", f"{type(exc).__name__}: {exc}"
            return traj
        model_s = time.perf_counter() - t0
        metrics.add_time("model_call", model_s)
        metrics.count("tokens/generated", len(out.token_ids))
        if out.finish_reason == "abort":
            traj.status, traj.error = "cancelled", "generation aborted"
            return traj
        text = tokenizer.decode(out.token_ids)
        step = Step(
            context_len=len(context),
            action_ids=list(out.token_ids),
            logprobs=list(out.logprobs),
            versions=list(out.versions),
            finish_reason=out.finish_reason,
            action_text=text,
            timings={"model_s": model_s},
            context_ids=None if whole else list(context),
        )
        traj.append_action(step)
        if out.finish_reason == "length":
            traj.status = "max_tokens"  # the turn never ended: nothing for the env to act on
            return traj
        action = parse(text)
        capped = cap_tool_calls(action, config.max_tool_calls_per_turn)
        if capped is not action:
            metrics.count("tool_calls/not_run", len(action.tool_calls) - len(capped.tool_calls))
        t0 = time.perf_counter()
        ran: list[dict] = []  # the call_tool calls of this step (STEP_CALLS)
        scope = STEP_CALLS.set(ran)
        try:
            result = await env.step(capped)
        except asyncio.CancelledError:
            raise
        except ToolUnavailable as exc:
            traj.status, traj.error = "tool_error", f"ToolUnavailable: {exc}"
            return traj
        except Exception as exc:
            traj.status, traj.error = "env_error", f"{type(exc).__name__}: {exc}"
            return traj
        finally:  # the agent's time, counted even for a step the deadline cut off
            STEP_CALLS.reset(scope)
            env_s = time.perf_counter() - t0
            traj.timings["actions_s"] = traj.timings.get("actions_s", 0.0) + env_s
        step.timings["env_s"] = env_s
        step.reward, step.done = float(result.reward), bool(result.done)
        info = result.info
        if ran and not info.get("tool_calls"):  # the environment ran call_tool itself
            info = {**info, "tool_calls": ran}
        step.tool_calls = tool_call_records(capped, info, getattr(env, "tools", None) or {})
        try:
            add_env_metrics(traj, result.info)
        except ValueError as exc:  # the environment's own mistake, named
            traj.status, traj.error = "env_error", f"{type(env).__name__}.step: {exc}"
            return traj
        metrics.add_time("env_step", env_s)
        for call in step.tool_calls:
            _record_tool_call(metrics, call)
        if result.done:
            traj.status = "ok"
            return traj
        try:
            observation = template.observation_ids(result.messages or result.observation)
        except ValueError as exc:  # e.g. a character the built-in tokenizer does not have
            traj.status, traj.error = (
                "env_error",
                f"the observation cannot be encoded by the tokenizer: {exc}",
            )
            return traj
        traj.append_observation(observation)
    traj.status = "max_turns"
    return traj


def tool_call_records(action: Action, info: Mapping[str, Any], tools: Mapping) -> list[dict]:
    """One record per tool call of the turn, counted from the agent's parsed ``action``
    (so ``rollout/tool_use_fraction`` and ``count/tool/<name>/calls_total`` see the calls of an
    environment written on :class:`~tunix_agentic.envs.base.Environment` that runs them
    itself and reports nothing), each with what the environment reported of it in call
    order (``info["tool_calls"]``, as :func:`~tunix_agentic.envs.base.run_tool_calls`
    fills it: ``seconds``, ``error``, ``kind``), which only it knows. A call the
    environment did not report, to a tool outside the ``tools`` it declares, is
    ``kind: "unknown_tool"`` (a name the model made up)."""
    records: list[dict] = [{"name": call.name} for call in action.tool_calls]
    if tools:
        for rec in records:
            if rec["name"] not in tools:
                rec["kind"] = "unknown_tool"
    for i, reported in enumerate(info.get("tool_calls") or ()):
        if i < len(records):
            records[i] = {**records[i], **reported}
        else:
            records.append(dict(reported))
    return records


_METRIC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


def add_env_metrics(traj: Trajectory, info: Mapping[str, Any]) -> None:
    """Adds a step's ``info["metrics"]`` (``{name: number}``, the environment's own
    figures, e.g. ``{"guesses": 1}``) to the episode's sums in ``traj.info["metrics"]``;
    the trainer logs their mean over a step's episodes as ``rollout/env/<name>``
    (:func:`~tunix_agentic.rollout.stats.rollout_stats`). Raises ``ValueError`` naming
    the key for a name that is not a metric name or a value that is not a finite number."""
    reported = info.get("metrics")
    if reported is None:
        return
    if not isinstance(reported, Mapping):
        raise ValueError(
            f'info["metrics"] must map names to numbers, got {type(reported).__name__}'
        )
    sums = traj.info.setdefault("metrics", {})
    for name, value in reported.items():
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
            raise ValueError(
                f'info["metrics"] key {name!r} is not a metric name (letters, digits, _ . / -)'
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f'info["metrics"][{name!r}] must be a finite number, got {value!r}')
        sums[name] = sums.get(name, 0.0) + float(value)


def _record_tool_call(metrics: MetricsSink, call: dict) -> None:
    """``count/tool/<name>/calls_total`` of one call, ``time/tool/<name>`` when the environment
    reported its seconds and, for a failed one, ``count/tool/<name>/error_total``,
    ``count/tool/<name>/<kind>_total`` and, for one that raised,
    ``count/tool/<name>/exception/<ExceptionClass>_total`` (a call to an unknown tool, a name the model made up, is
    only ``count/tool_calls/unknown_tool_total``)."""
    name, kind = call.get("name", "?"), call.get("kind")
    if kind == "unknown_tool":
        metrics.count("tool_calls/unknown_tool")
        return
    metrics.count(f"tool/{name}/calls")
    if "seconds" in call:
        metrics.add_time(f"tool/{name}", float(call["seconds"]))
    if call.get("error"):
        metrics.count(f"tool/{name}/error")
        if kind:
            metrics.count(f"tool/{name}/{kind}")
        exception = call.get("exception")
        if isinstance(exception, str) and exception.isidentifier():  # which one it raised
            metrics.count(f"tool/{name}/exception/{exception}")
