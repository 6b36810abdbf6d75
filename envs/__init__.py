"""Environments and tools for tool-using agents, looked up by name with :func:`make_env`.

Importing this package registers the built-in environments: ``"arithmetic"``
(a calculator tool), ``"countdown"`` (TinyZero's numbers game), ``"frozenlake"``
(a multi-turn grid game) and ``"remote"`` (any environment served over HTTP by
``tunix-agentic serve-env``).
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
from tunix_agentic.envs.remote import RemoteEnv, RemoteEnvError
from tunix_agentic.envs.tools import Tool, ToolResult, ToolUnavailable, call_tool

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
    "RemoteEnv",
    "RemoteEnvError",
    "StepResult",
    "Task",
    "TaskSource",
    "Tool",
    "ToolCall",
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
    "safe_eval",
]
