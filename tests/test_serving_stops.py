"""serve-engine's SGLang stop rules without real weights: end-of-sequence ids joined unless
``ignore_eos``, ``stop`` strings cut where their text completes, bad values refused
(the wire test on SmolLM2 is in tests/test_real_model.py)."""

from __future__ import annotations

import pytest

from tunix_agentic.inference.base import TokenOutput
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.hf_tokenizer import save_char_tokenizer
from tunix_agentic.serving.generate_request import parse_sampling_params, parse_text_options
from tunix_agentic.serving.stops import ModelText, cut_at_stop_string, cut_off_loop, output_text

CHAR = CharTokenizer()


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> ModelText:
    path = save_char_tokenizer(CHAR, tmp_path_factory.mktemp("char"), chat_template="x")
    return ModelText.from_dir(path)


def test_eos_ids_come_from_generation_and_tokenizer_config(text):
    assert text.eos_ids == (CHAR.im_end_id, CHAR.eos_id)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ({}, (7, 5)),
        ({"stop_token_ids": [9]}, (9, 7, 5)),
        ({"stop_token_ids": [9], "ignore_eos": True}, (9,)),
        ({"ignore_eos": True}, ()),
    ],
    ids=["eos", "eos-after-own", "ignore-eos-keeps-own", "ignore-eos"],
)
def test_the_models_eos_stops_a_request_unless_ignore_eos(raw, want):
    params = parse_sampling_params(raw, max_seq_len=64, vocab_size=128, eos_ids=(7, 5))
    assert params.stop_token_ids == want


@pytest.mark.parametrize(
    ("raw", "can_decode", "field"),
    [
        ({"ignore_eos": "yes"}, True, "ignore_eos"),
        ({"stop": [""]}, True, "stop"),
        ({"stop": 3}, True, "stop"),
        ({"stop": "x"}, False, "tokenizer"),
        ({"skip_special_tokens": 1}, True, "skip_special_tokens"),
    ],
    ids=["ignore-eos-not-bool", "empty-stop", "stop-not-string", "no-tokenizer", "skip-not-bool"],
)
def test_bad_stop_options_are_refused_naming_the_field(raw, can_decode, field):
    with pytest.raises(ValueError, match=field):
        parse_sampling_params(raw, max_seq_len=64, vocab_size=128, eos_ids=(7,))
        parse_text_options(raw, can_decode=can_decode)


def test_stop_strings_cut_after_the_token_completing_them(text):
    ids = CHAR.encode("12+30 = 42<|im_end|>")
    out = TokenOutput(ids, [-0.5] * len(ids), "stop", CHAR.im_end_id, [3] * len(ids))
    assert parse_text_options({"stop": ["= 4", "+"]}, can_decode=True) == (("= 4", "+"), True)
    match = cut_at_stop_string(out, ("= 4", "0 "), text)
    assert match is not None and match.matched == "0 "  # the earliest occurrence wins
    assert CHAR.decode(match.output.token_ids) == "12+30 "
    assert len(match.output.logprobs) == len(match.output.versions) == 6
    assert output_text(match.output, text, skip_special_tokens=True, matched="0 ") == "12+3"
    assert cut_at_stop_string(out, ("zebra",), text) is None
    assert output_text(out, text, skip_special_tokens=False, matched=None).endswith("<|im_end|>")
    assert output_text(out, text, skip_special_tokens=True, matched=None) == "12+30 = 42"


def test_a_stop_string_at_the_end_of_a_long_reply_is_found_in_log_n_decodes(text):
    """Hostile-client round 3: a stop string completed by the last of 12,000 tokens. The cut
    is found by bisection (a decode per halving, not one per token: 16-21 s before), off
    the event loop for a long output (:func:`cut_off_loop`), and is the same cut."""
    import asyncio
    import dataclasses

    ids = CHAR.encode("ab" * 6000 + "STOP" + "zz")
    out = TokenOutput(ids, [-0.1] * len(ids), "length", None, [0] * len(ids))

    class Counting:  # the real tokenizer, its decodes counted
        decodes = 0

        def decode(self, token_ids, skip_special_tokens):
            Counting.decodes += 1
            return text.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    counted = dataclasses.replace(text, tokenizer=Counting())
    match = cut_at_stop_string(out, ("STOP",), counted)
    assert match is not None and len(match.output.token_ids) == 12004
    assert CHAR.decode(match.output.token_ids).endswith("abSTOP")
    assert Counting.decodes <= 2 + 14  # the whole text once, then log2(12,006) halvings
    assert asyncio.run(cut_off_loop(out, ("STOP",), text)) == cut_at_stop_string(
        out, ("STOP",), text
    )
