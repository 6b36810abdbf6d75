"""tunix-agentic: JAX-native reinforcement learning for multi-turn, tool-using LLM agents.

The names a notebook needs, importable from the top (``from tunix_agentic import
Trainer, load_config``). They load lazily: ``import tunix_agentic`` imports no
JAX until one is used, and a module is imported only when a name from it is.

* a run: :func:`train`, :class:`Trainer`, :func:`load_config`, :class:`RunConfig`;
* engines: :class:`JaxEngine`, :class:`SGLangEngine`, :class:`EnginePool`, ...;
* rollout: :class:`RolloutOrchestrator`, :class:`Trajectory`, :func:`run_agent`;
* environments and tools: :class:`Environment`, :class:`Tool`, :func:`register_env`;
* learners: :class:`GRPOLearner`, :class:`SFTTrainer`;
* the RL loop itself: :func:`run_rl_steps`.
"""

from __future__ import annotations

from importlib import metadata

from tunix_agentic.lazy import lazy_exports

try:
    __version__ = metadata.version("tunix-agentic")
except metadata.PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0+unknown"

# Public name -> the module that defines it.
_API: dict[str, str] = {
    # runs
    "train": "tunix_agentic.trainer",
    "Trainer": "tunix_agentic.trainer",
    "TrainResult": "tunix_agentic.trainer",
    "RunInterrupted": "tunix_agentic.signals",
    "RunConfig": "tunix_agentic.config",
    "ConfigError": "tunix_agentic.config",
    "load_config": "tunix_agentic.config",
    "Checkpointer": "tunix_agentic.checkpoint",
    "MetricsRecorder": "tunix_agentic.metrics.recorder",
    "read_scalars": "tunix_agentic.metrics.recorder",
    "run_rl_steps": "tunix_agentic.rl_loop",
    "StepReport": "tunix_agentic.rl_loop",
    # engines
    "InferenceEngine": "tunix_agentic.inference.base",
    "TokenOutput": "tunix_agentic.inference.base",
    "WeightUpdate": "tunix_agentic.inference.base",
    "EngineError": "tunix_agentic.inference.base",
    "SamplingParams": "tunix_agentic.inference.params",
    "JaxEngine": "tunix_agentic.inference.engine",
    "EngineConfig": "tunix_agentic.inference.config",
    "EnginePool": "tunix_agentic.inference.pool",
    "CrossPolicyEngine": "tunix_agentic.inference.cross_policy",
    "SGLangEngine": "tunix_agentic.serving.client",
    # rollout and agents
    "RolloutOrchestrator": "tunix_agentic.rollout.orchestrator",
    "RolloutConfig": "tunix_agentic.rollout.config",
    "Group": "tunix_agentic.rollout.group",
    "Trajectory": "tunix_agentic.trajectory",
    "TaskLike": "tunix_agentic.trajectory",
    "Step": "tunix_agentic.trajectory",
    "AgentConfig": "tunix_agentic.agent.loop",
    "run_agent": "tunix_agentic.agent.loop",
    "ChatTemplate": "tunix_agentic.agent.chat",
    # environments and tools
    "Environment": "tunix_agentic.envs.base",
    "StepResult": "tunix_agentic.envs.base",
    "Action": "tunix_agentic.envs.base",
    "make_env": "tunix_agentic.envs.base",
    "register_env": "tunix_agentic.envs.base",
    "Task": "tunix_agentic.envs.base",
    "TaskSource": "tunix_agentic.envs.base",
    "Sandbox": "tunix_agentic.envs.sandbox",
    "SandboxConfig": "tunix_agentic.envs.sandbox",
    "SandboxedEnv": "tunix_agentic.envs.sandboxed",
    "FileTaskSource": "tunix_agentic.data.tasks",
    "Tool": "tunix_agentic.envs.tools",
    "ToolCall": "tunix_agentic.envs.tools",
    "ToolResult": "tunix_agentic.envs.tools",
    "ToolUnavailable": "tunix_agentic.envs.tools",
    "ToolError": "tunix_agentic.envs.tools",
    "ToolEnvironment": "tunix_agentic.envs.tool_env",
    "tool": "tunix_agentic.envs.tool_env",
    # models and learners
    "Transformer": "tunix_agentic.models.transformer",
    "ModelConfig": "tunix_agentic.models.transformer",
    "CharTokenizer": "tunix_agentic.models.char_tokenizer",
    "GRPOLearner": "tunix_agentic.learners.grpo",
    "GRPOConfig": "tunix_agentic.learners.grpo_config",
    "SFTTrainer": "tunix_agentic.learners.sft",
    "OptimizerConfig": "tunix_agentic.learners.state",
}

__all__ = sorted(_API)


__getattr__, __dir__ = lazy_exports(__name__, _API, globals())
