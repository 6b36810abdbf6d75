"""Tools an agent can call: the interface, the call wrapper, and the sandboxed tools.

:mod:`~tunix_agentic.envs.tools.base` holds the interface (:class:`Tool`, :class:`ToolCall`,
:class:`ToolResult`, :class:`ToolError`, :class:`ToolUnavailable`), the ``jsonschema``
check of a call's arguments, and :func:`call_tool`, which turns every failure a model can
cause into an error result; :mod:`~tunix_agentic.envs.tools.failures` warns about a tool
that keeps raising. The tools that run in a per-episode
:class:`~tunix_agentic.envs.sandbox.Sandbox` live beside it: ``bash``
(:class:`BashTool`, :mod:`~tunix_agentic.envs.tools.terminal`), ``python``
(:class:`PythonTool`, :mod:`~tunix_agentic.envs.tools.python_tool`) and ``file_edit``
(:class:`FileEditTool`, :mod:`~tunix_agentic.envs.tools.file_edit`, with the line helpers
:func:`numbered` and :func:`replace_lines`). Environments that use them stay in
:mod:`tunix_agentic.envs`.
"""

from tunix_agentic.envs.tools.base import (
    ERROR_PREFIX,
    ErrorKind,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    ToolUnavailable,
    call_tool,
    check_parameters,
    validate_arguments,
)
from tunix_agentic.envs.tools.failures import TOOL_FAILURES, ToolFailureMonitor, ToolHealth
from tunix_agentic.envs.tools.file_edit import FileEditTool, numbered, replace_lines
from tunix_agentic.envs.tools.python_tool import PythonTool
from tunix_agentic.envs.tools.terminal import BashTool

__all__ = [
    "ERROR_PREFIX",
    "TOOL_FAILURES",
    "BashTool",
    "ErrorKind",
    "FileEditTool",
    "PythonTool",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolFailureMonitor",
    "ToolHealth",
    "ToolResult",
    "ToolUnavailable",
    "call_tool",
    "check_parameters",
    "numbered",
    "replace_lines",
    "validate_arguments",
]
