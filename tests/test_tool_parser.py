"""Tests for tunix_agentic.agent.tool_parser: Qwen3 tool calls, answers and parse errors."""

from __future__ import annotations

import pytest

from tunix_agentic.agent.tool_parser import format_tool_call, get_parser, parse_qwen3
from tunix_agentic.envs.base import Action, ToolCall

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'


def test_valid_call():
    action = parse_qwen3(CALC + "<|im_end|>")
    assert action == Action(
        text=CALC + "<|im_end|>",
        tool_calls=(ToolCall("calculator", {"expression": "2+3"}),),
        answer=None,
        parse_errors=(),
    )


def test_two_calls_in_order():
    text = (
        'Let me check.\n<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"q": "x", "k": 3}}\n</tool_call>'
    )
    action = parse_qwen3(text)
    assert action.tool_calls == (
        ToolCall("calculator", {"expression": "1+1"}),
        ToolCall("search", {"q": "x", "k": 3}),
    )
    assert action.parse_errors == ()
    assert action.answer is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"6*7\\"}"}</tool_call>',
            ToolCall("calculator", {"expression": "6*7"}),
        ),
        ('<tool_call>{"name": "noop"}</tool_call>', ToolCall("noop", {})),
    ],
    ids=["arguments_as_json_string", "arguments_missing"],
)
def test_call_variants_parse(text, expected):
    action = parse_qwen3(text)
    assert action.tool_calls == (expected,)
    assert action.parse_errors == ()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "<tool_call>{not json}</tool_call>",
            "tool call is not valid JSON (Expecting property name enclosed in double quotes at column 2)",
        ),
        (  # json says "starting at"; the message says "at column" once
            '<tool_call>{"name": "x</tool_call>',
            "tool call is not valid JSON (Unterminated string starting at column 10)",
        ),
        (
            "<tool_call>[1, 2]</tool_call>",
            "tool call must be a JSON object with 'name' and 'arguments'",
        ),
        ('<tool_call>{"arguments": {}}</tool_call>', "tool call needs a non-empty string 'name'"),
        (
            '<tool_call>{"name": "", "arguments": {}}</tool_call>',
            "tool call needs a non-empty string 'name'",
        ),
        (
            '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
            "tool call needs a non-empty string 'name'",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
            "arguments of tool 'calculator' must be a JSON object",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": "2+3"}</tool_call>',
            "arguments of tool 'calculator' are a string that is not JSON",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": "[1]"}</tool_call>',
            "arguments of tool 'calculator' must be a JSON object",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}',
            "unterminated <tool_call>: expected </tool_call>",
        ),
        ("The result is 5.</tool_call>", "</tool_call> without a matching <tool_call>"),
    ],
    ids=[
        "invalid_json",
        "unterminated_string",
        "non_object",
        "missing_name",
        "empty_name",
        "name_not_string",
        "arguments_list",
        "arguments_string_not_json",
        "arguments_string_not_object",
        "unterminated",
        "stray_close",
    ],
)
def test_malformed_call_reports_error(text, error):
    action = parse_qwen3(text)  # never raises on model output
    assert action.tool_calls == ()
    assert action.parse_errors == (error,)


def test_bad_call_does_not_hide_good_call():
    text = "<tool_call>{oops}</tool_call>" + CALC
    action = parse_qwen3(text)
    assert action.tool_calls == (ToolCall("calculator", {"expression": "2+3"}),)
    assert len(action.parse_errors) == 1
    assert action.parse_errors[0].startswith("tool call is not valid JSON")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("<answer>42</answer>", "42"),
        ("So:\n<answer>  -3.5 \n</answer><|im_end|>", "-3.5"),
        ("<answer>\nfirst\nsecond\n</answer><|endoftext|>", "first\nsecond"),
        ("<answer>1</answer> then <answer>2</answer>", "1"),
        ("<answer></answer>", ""),
        ("<answer>7", None),
    ],
    ids=["plain", "whitespace_and_im_end", "multiline", "first_wins", "empty", "unclosed"],
)
def test_answer_extraction(text, answer):
    action = parse_qwen3(text)
    assert action.answer == answer
    assert action.tool_calls == ()
    assert action.parse_errors == ()


def test_turn_end_markers_stripped_but_text_kept():
    text = "<answer>5<|im_end|></answer><|endoftext|>"
    action = parse_qwen3(text)
    assert action.answer == "5"
    assert action.text == text


def test_call_and_answer_together():
    action = parse_qwen3(CALC + "\n<answer>5</answer><|im_end|>")
    assert action.tool_calls == (ToolCall("calculator", {"expression": "2+3"}),)
    assert action.answer == "5"


@pytest.mark.parametrize(
    "text",
    ["", "I think the answer is 5.", "tool_call answer <|im_end|>"],
    ids=["empty", "sentence", "bare_words"],
)
def test_plain_text_has_no_calls_and_no_answer(text):
    assert parse_qwen3(text) == Action(text=text, tool_calls=(), answer=None, parse_errors=())


def test_get_parser():
    assert get_parser("qwen3") is parse_qwen3
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'hermes'; known: \['qwen3'\]"):
        get_parser("hermes")


def test_a_registered_parser_is_a_config_choice(monkeypatch):
    """A user's format: ``register_parser`` makes it ``agent.parser: name``; a name taken by
    another parser, or a parser that is not callable, is refused."""
    from tunix_agentic.agent import AgentConfig, register_parser, tool_parser

    monkeypatch.setattr(tool_parser, "PARSERS", dict(tool_parser.PARSERS))

    def parse_bang(text: str) -> Action:  # "!name arg" calls tool name with {"x": arg}
        name, _, arg = text.removeprefix("!").partition(" ")
        return Action(text=text, tool_calls=(ToolCall(name, {"x": arg}),))

    register_parser("bang", parse_bang)
    register_parser("bang", parse_bang)  # the same parser again is fine
    assert get_parser("bang")("!echo hi").tool_calls == (ToolCall("echo", {"x": "hi"}),)
    assert AgentConfig(parser="bang").parser == "bang"
    with pytest.raises(ValueError, match="'qwen3' is already registered"):
        register_parser("qwen3", parse_bang)
    with pytest.raises(TypeError, match="must be callable"):
        register_parser("nope", "parse")
    with pytest.raises(ValueError, match=r"agent.parser: unknown tool-call parser 'hermes'"):
        AgentConfig(parser="hermes")


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("calculator", {"expression": "2+3"}),
        ("noop", {}),
        ("search", {"q": 'a "quoted" <b>word</b>', "k": 3, "deep": {"x": [1, 2.5, None, True]}}),
        ("unicode", {"s": "café ∑"}),
    ],
    ids=["calculator", "empty_args", "nested_and_quoted", "unicode"],
)
def test_format_tool_call_round_trip(name, arguments):
    text = format_tool_call(name, arguments)
    assert text.startswith("<tool_call>{") and text.endswith("}</tool_call>")
    action = parse_qwen3(text)
    assert action.tool_calls == (ToolCall(name, arguments),)
    assert action.parse_errors == ()


def test_format_tool_call_literal():
    assert format_tool_call("calculator", {"expression": "2+3"}) == CALC
