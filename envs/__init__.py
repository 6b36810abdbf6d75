"""Environments and tools for tool-using agents, looked up by name with :func:`make_env`.

Importing this package registers the built-in environments: ``"arithmetic"``
(a calculator tool), ``"countdown"`` (TinyZero's numbers game), ``"frozenlake"``
(a multi-turn grid game), ``"math_python"`` (word problems with a Python
interpreter), ``"swe_lite"`` (fix a bug in a small repository with bash and
file_edit, judged by hidden tests) and ``"remote"`` (any environment served over
HTTP by ``tunix-agentic serve-env``). The last two and math_python run their
tools in a per-episode :class:`~tunix_agentic.envs.sandbox.Sandbox`. Your own tool-using
environment subclasses :class:`ToolEnvironment` (tools declared with :func:`tool`).
"""

from tunix_agentic.envs.base import (
    Action,
    Environment,
    StepResult,
    Task,
    TaskSource,
    ToolCall,
    available_envs,
    env_tasks,
    import_env_modules,
    make_env,
    register_env,
    run_tool_calls,
)
from tunix_agentic.envs.calculator import (
    ArithmeticEnv,
    ArithmeticTask,
    ArithmeticTasks,
    CalculatorTool,
    format_number,
    make_arithmetic_task,
    safe_eval,
)
from tunix_agentic.envs.countdown import CountdownEnv, CountdownTasks
from tunix_agentic.envs.frozenlake import FrozenLakeEnv, FrozenLakeTasks
from tunix_agentic.envs.math_python import MathPythonEnv, MathTasks
from tunix_agentic.envs.remote import RemoteEnv, RemoteEnvError
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig
from tunix_agentic.envs.sandboxed import SandboxedEnv
from tunix_agentic.envs.swe_lite import RepoTasks, SweLiteEnv
from tunix_agentic.envs.tool_env import FunctionTool, ToolEnvironment, tool
from tunix_agentic.envs.tools import Tool, ToolError, ToolResult, ToolUnavailable, call_tool

__all__ = [
    "Action",
    "ArithmeticEnv",
    "ArithmeticTask",
    "ArithmeticTasks",
    "CountdownEnv",
    "CountdownTasks",
    "CalculatorTool",
    "Environment",
    "FrozenLakeEnv",
    "FrozenLakeTasks",
    "FunctionTool",
    "MathPythonEnv",
    "MathTasks",
    "RemoteEnv",
    "RemoteEnvError",
    "RepoTasks",
    "Sandbox",
    "SandboxConfig",
    "SandboxedEnv",
    "SweLiteEnv",
    "StepResult",
    "Task",
    "TaskSource",
    "Tool",
    "ToolCall",
    "ToolEnvironment",
    "ToolError",
    "ToolResult",
    "ToolUnavailable",
    "available_envs",
    "call_tool",
    "env_tasks",
    "format_number",
    "import_env_modules",
    "make_arithmetic_task",
    "make_env",
    "register_env",
    "run_tool_calls",
    "safe_eval",
    "tool",
]
