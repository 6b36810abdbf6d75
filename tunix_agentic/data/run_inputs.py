"""What a run config fixes on the host side: tokenizer, chat template and task sources.

One builder for every process that runs episodes of a run: the trainer
(:mod:`tunix_agentic.run_setup`, which adds its checks before any work) and a rollout
node (:func:`tunix_agentic.rollout.service.node.setup_from_config`) both call
:func:`run_inputs`, so one config renders the same prompt ids in either (the chat
template gets all of ``agent.template_options()``: a template without a tools section
lists the tools as ``agent.tools_fallback`` says, on a node as in process). No JAX.

``config`` is a :class:`~tunix_agentic.config.RunConfig`, typed by what is read of it
(:class:`RunInputsConfig`: the config imports the rollout package, which imports this one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tunix_agentic.agent.chat import ChatFormat, TemplateError, make_chat_template
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.data.sources import RunSources
from tunix_agentic.envs.sandbox import SandboxConfig
from tunix_agentic.models.config import ModelConfig
from tunix_agentic.models.tokenizer import Tokenizer
from tunix_agentic.models.tokenizers import load_tokenizer


class RunEnvConfig(Protocol):
    """What is read of a run's ``env`` section (:class:`~tunix_agentic.config.EnvConfig`)."""

    @property
    def name(self) -> str: ...
    @property
    def kwargs(self) -> Mapping[str, Any]: ...
    @property
    def tool_timeout_s(self) -> float | None: ...
    @property
    def sandbox(self) -> SandboxConfig: ...


class RunInputsConfig(Protocol):
    """What the builders here read of a :class:`~tunix_agentic.config.RunConfig`."""

    @property
    def model(self) -> ModelConfig: ...
    @property
    def agent(self) -> AgentConfig: ...
    @property
    def env(self) -> RunEnvConfig: ...
    @property
    def tasks(self) -> Sequence[Any]: ...  # resolved TaskSourceConfigs (RunSources' specs)


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """The tokenizer, the chat template over it and the run's task sources."""

    tokenizer: Tokenizer
    template: ChatFormat
    sources: RunSources


def run_tokenizer(config: RunInputsConfig) -> Tokenizer:
    """The tokenizer of ``config.model`` (``source``, ``path``, ``vocab_size``)."""
    model = config.model
    return load_tokenizer(model.source, model.path, model.vocab_size)


def run_template(config: RunInputsConfig, tokenizer: Tokenizer) -> ChatFormat:
    """The model's chat template with ``agent``'s template options (template variables,
    ``tools_fallback``, ``tools_prompt``); ValueError naming ``model.path`` when the
    tokenizer's template cannot serve."""
    try:
        return make_chat_template(tokenizer, **config.agent.template_options())
    except TemplateError as exc:
        raise ValueError(f"model.path={config.model.path!r}: {exc}") from None


def run_task_sources(config: RunInputsConfig) -> RunSources:
    """The run's task sources (``tasks``, with ``env.*`` for their environments);
    ValueError naming the source that cannot be built."""
    env = config.env
    return RunSources(
        config.tasks,
        tool_timeout=env.tool_timeout_s,
        sandbox=env.sandbox,
        env_name=env.name,
        env_kwargs=env.kwargs,
    )


def run_inputs(config: RunInputsConfig, tokenizer: Tokenizer | None = None) -> RunInputs:
    """The :class:`RunInputs` of ``config``: ``tokenizer`` (loaded from ``config.model``
    when None), its chat template and the task sources. ValueError naming the key when a
    piece cannot be built."""
    tokenizer = run_tokenizer(config) if tokenizer is None else tokenizer
    template = run_template(config, tokenizer)
    return RunInputs(tokenizer=tokenizer, template=template, sources=run_task_sources(config))
