"""The grammars a request's constraints become: a forced tool call in the qwen3 tool-call
form, and a JSON output format (enforced by the engine's constrained decoding, token by
token). Pure functions that raise ``ValueError`` for a schema past the bounds a grammar
compile may take; :mod:`~.protocol` names the field. Nothing here imports JAX."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from tunix_agentic.inference.constraint import Constraint

# The Qwen3 tool-call form (tool_parser.format_tool_call), as a grammar's fixed pieces.
_CALL_BEGIN = '<tool_call>\n{"name": "'
_CALL_ARGUMENTS = '", "arguments": '
_CALL_END = "}\n</tool_call>"


def json_grammar(
    kind: Literal["text", "json_object", "json_schema"], schema: Mapping[str, Any]
) -> Constraint | None:
    """The grammar of a JSON output format: ``text`` None, ``json_object`` any object,
    ``json_schema`` ``schema`` (an empty one: any object)."""
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object()
    return Constraint("json_schema", json.dumps(schema or {"type": "object"}))


def _arguments_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    parameters = dict(tool["function"].get("parameters") or {})
    return parameters if parameters.get("type") == "object" else {"type": "object", **parameters}


def forced_call_grammar(tools: Sequence[Mapping[str, Any]], name: str | None) -> Constraint:
    """An xgrammar structural tag: one call to ``name``, or (None) text with at least one
    call to any of ``tools``, each call in the qwen3 form with arguments that match the
    tool's JSON schema."""
    tags = [
        {
            "type": "tag",
            "begin": _CALL_BEGIN + t["function"]["name"] + _CALL_ARGUMENTS,
            # (at most one blank in a row: else a model may pad the call with blanks
            # until its length limit)
            "content": {
                "type": "json_schema",
                "json_schema": _arguments_schema(t),
                "max_whitespace_cnt": 1,
            },
            "end": _CALL_END,
        }
        for t in tools
    ]
    if name is not None:
        tag = {"type": "structural_tag", "format": tags[0]}
    else:
        triggered = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags}
        tag = {"type": "structural_tag", "format": {**triggered, "at_least_one": True}}
    return Constraint("structural_tag", json.dumps(tag))
