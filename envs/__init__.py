"""Environments and tools for tool-using agents, looked up by name with :func:`make_env`.

Importing this package registers the built-in environments (``"arithmetic"``).
"""

from tunix_agentic.envs.base import (
    Action,
    Environment,
    StepResult,
    ToolCall,
    available_envs,
    make_env,
    register_env,
)
from tunix_agentic.envs.calculator import (
    ArithmeticEnv,
    ArithmeticTask,
    CalculatorTool,
    format_number,
    make_arithmetic_task,
    safe_eval,
)
from tunix_agentic.envs.tools import Tool, ToolResult, ToolUnavailable, call_tool

__all__ = [
    "Action",
    "ArithmeticEnv",
    "ArithmeticTask",
    "CalculatorTool",
    "Environment",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolUnavailable",
    "available_envs",
    "call_tool",
    "format_number",
    "make_arithmetic_task",
    "make_env",
    "register_env",
    "safe_eval",
]
