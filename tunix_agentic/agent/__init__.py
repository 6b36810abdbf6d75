"""Agents: chat framing, tool-call parsing, context rules and the agent loop."""

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig, run_agent
from tunix_agentic.agent.tool_parser import get_parser, parse_qwen3, register_parser

__all__ = [
    "AgentConfig",
    "ChatTemplate",
    "get_parser",
    "parse_qwen3",
    "register_parser",
    "run_agent",
]
