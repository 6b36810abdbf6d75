"""Agents: chat framing, tool-call parsing, context rules and the agent loop."""

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig, run_agent
from tunix_agentic.agent.tool_parser import get_parser, parse_qwen3

__all__ = ["AgentConfig", "ChatTemplate", "get_parser", "parse_qwen3", "run_agent"]
