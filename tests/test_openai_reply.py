"""A chat reply built from sampled ids: offered calls only, and streamed deltas that add up
to the non-streamed message, token by token, with a byte-level BPE whose tokens split
multi-byte characters."""

from __future__ import annotations

import json

import pytest

from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.inference.base import TokenOutput
from tunix_agentic.models.hf_tokenizer import HFTokenizer
from tunix_agentic.rollout.openai_endpoint.reply import (
    StreamChoice,
    finish_reason,
    parse_reply,
    stream_chunks,
    token_ends,
)
from tunix_agentic.testing import write_bpe_tokenizer

WORDS = "the agent calls a tool then reads über naïve 数字 ✓".split()
CALL = '<tool_call>{"name": "calc", "arguments": {"x": "数字"}}</tool_call>'


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    corpus = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40)) for i in range(60)]
    # few merges: the multi-byte characters stay split over several ids
    path = write_bpe_tokenizer(tmp_path_factory.mktemp("bpe"), corpus, 270, "")
    return HFTokenizer.from_dir(path)


def merged(chunks):
    """What a client gets by adding up the deltas of the one choice."""
    content, calls, finish = None, {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("content") is not None:
                content = (content or "") + delta["content"]
            for part in delta.get("tool_calls") or ():
                call = calls.setdefault(part["index"], {"name": None, "arguments": ""})
                call["name"] = call["name"] or part["function"].get("name")
                call["arguments"] += part["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


CASES = {
    "text": ("über naïve 数字 ✓ then", {"calc"}, None),
    "call-in-text": (f"the agent 数字 {CALL} reads ✓", {"calc"}, None),
    "only-a-call": (CALL, {"calc"}, None),
    "not-offered": (f"the {CALL}", {"other"}, None),
    "stop-trimmed": ("über naïve 数字 ✓ then", {"calc"}, "数"),
}


@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_streamed_deltas_add_up_to_the_reply(bpe, case):
    text, offered, stop = CASES[case]
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    shown = text[: text.index(stop)] if stop else text
    reply = parse_reply(shown, ids, parse=get_parser("qwen3"), offered=offered)
    out = TokenOutput(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop")
    ends = token_ends(bpe.decode, ids, reply.text)
    assert len(ends) == len(ids) and ends == sorted(ends) and ends[-1] == len(shown)
    head = {"id": "c", "created": 0, "model": "m"}
    choice = StreamChoice(reply, finish_reason(out, reply), ends)
    chunks = list(stream_chunks(head, [choice], usage={"prompt_tokens": 1}))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 1}
    content, calls, finish = merged(chunks)
    message = reply.message
    assert content == message["content"] and finish == finish_reason(out, reply)
    want = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or ()
    ]
    assert calls == want
    if case == "call-in-text":
        assert content == "the agent 数字  reads ✓"
        assert json.loads(calls[0]["arguments"]) == {"x": "数字"}
    if case == "not-offered":  # the block stays text, counted
        assert calls == [] and content == text and reply.unoffered == 1
    if case == "text":  # a delta per id that completes a character: none is a split byte
        assert any("\ufffd" in bpe.decode([i]) for i in ids)  # ids that split a character
        pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
        assert all(p and "\ufffd" not in p for p in pieces)
        assert len(pieces) == len(set(ends)) - (ends[0] == 0)


@pytest.mark.parametrize(
    ("text", "holds", "shown"),
    [
        ("the agent reads über 数字 ✓ then", [], None),  # all but the last id's text
        (f"  the agent {CALL} then", ["<tool_call>"], "  the agent "),
        ("the agent calls a <tool_c", ["<tool_call>"], "the agent calls a "),
        ("the agent calls STOP a tool", ["STOP"], "the agent calls "),
        ("the agent calls ST", ["STOP"], "the agent calls "),
        (f"   {CALL}", ["<tool_call>"], ""),  # whitespace then a call: nothing yet
    ],
    ids=["text", "call", "call-prefix", "stop", "stop-prefix", "whitespace"],
)
def test_live_text_shows_a_prefix_of_the_final_content(bpe, text, holds, shown):
    """Fed id by id, what shows live is the text but what may still change: the last id's
    characters, a tool-call block or stop string and a tail that could begin one, and
    whitespace-only content; every piece extends what was shown."""
    from tunix_agentic.rollout.openai_endpoint.live import LiveText

    ids = bpe.encode(text)
    live = LiveText(bpe.decode, holds, end_ids=())
    pieces = [live.add([i]) for i in ids]
    assert "".join(pieces) == live.shown
    expected = bpe.decode(ids[:-1]).rstrip("\ufffd") if shown is None else shown
    assert live.shown == expected and text.startswith(live.shown)
