"""Tools an agent can call: the interface, the call wrapper, and the sandboxed tools.

:mod:`~tunix_agentic.envs.tools.base` holds the interface (:class:`Tool`, :class:`ToolCall`,
:class:`ToolResult`, :class:`ToolUnavailable`) and :func:`call_tool`, which turns every
failure a model can cause into an error result. The tools that run in a per-episode
:class:`~tunix_agentic.envs.sandbox.Sandbox` live beside it: ``bash``
(:class:`BashTool`, :mod:`~tunix_agentic.envs.tools.terminal`), ``python``
(:class:`PythonTool`, :mod:`~tunix_agentic.envs.tools.python_tool`) and ``file_edit``
(:class:`FileEditTool`, :mod:`~tunix_agentic.envs.tools.file_edit`, with the line helpers
:func:`numbered` and :func:`replace_lines`). Environments that use them stay in
:mod:`tunix_agentic.envs`.
"""

from tunix_agentic.envs.tools.base import (
    ERROR_PREFIX,
    Tool,
    ToolCall,
    ToolResult,
    ToolUnavailable,
    call_tool,
)
from tunix_agentic.envs.tools.file_edit import FileEditTool, numbered, replace_lines
from tunix_agentic.envs.tools.python_tool import PythonTool
from tunix_agentic.envs.tools.terminal import BashTool

__all__ = [
    "ERROR_PREFIX",
    "BashTool",
    "FileEditTool",
    "PythonTool",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolUnavailable",
    "call_tool",
    "numbered",
    "replace_lines",
]
