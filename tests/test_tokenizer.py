"""Tests for tunix_agentic.models.tokenizer: CharTokenizer ids, round trips and errors."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_agentic.models.char_tokenizer import SPECIAL_TOKENS, WORD_TOKENS, CharTokenizer

NATURAL_SIZE = 115  # 10 special tokens + 96 characters + 9 word tokens

CHAT = (
    "<|im_start|>system\nYou are a calculator agent.<|im_end|>\n"
    "<|im_start|>user\nCompute 12*(3+4)<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12*(3+4)"}}</tool_call>'
    "<|im_end|>\n"
    "<|im_start|>user\n<tool_response>84</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<answer>84</answer><|im_end|><|endoftext|>"
)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello, world!",
        "line one\nline two\n",
        CHAT,
        "users of the system assistant say: Compute calculators",
        "<|im <tool_ <answer <|im_end| </tool_cal",  # prefixes of specials, never completed
        '"}} "} "expression": " ", "arguments": {',
        "~`!@#$%^&*()_+-=[]{}|;':\",./<>?\\",
    ],
    ids=[
        "empty",
        "plain",
        "newlines",
        "chat",
        "word_tokens",
        "partial_specials",
        "json_words",
        "punct",
    ],
)
def test_round_trip(text):
    tok = CharTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_natural_vocab_size_and_id_layout():
    tok = CharTokenizer()
    assert tok.vocab_size == NATURAL_SIZE
    assert tok.special_ids() == list(range(10))
    assert tok.token_id("\n") == 10
    assert tok.token_id(" ") == 11
    assert tok.token_id("~") == 105
    assert tok.token_id("user") == 106
    assert tok.token_id("Compute ") == 114


@pytest.mark.parametrize("token", SPECIAL_TOKENS + WORD_TOKENS, ids=lambda t: repr(t))
def test_special_and_word_tokens_are_single_ids(token):
    tok = CharTokenizer()
    ids = tok.encode(token)
    assert ids == [tok.token_id(token)]
    assert tok.decode(ids) == token


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<|im_start|>user\nCompute 2+3<|im_end|>", [2, 106, 10, 114, 29, 22, 30, 3]),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
            [4, 109, 113, 110, 111, 29, 22, 30, 112, 5],
        ),
        ("<answer>5</answer>", [8, 32, 9]),
        ("Compute", [46, 90, 88, 91, 96, 95, 80]),  # no trailing space: not the word token
        ("calculators", [113, 94]),
        ("<|im_end", [39, 103, 84, 88, 74, 80, 89, 79]),  # incomplete special: characters
        ('"}', [13, 104]),
    ],
    ids=[
        "chat_turn",
        "tool_call",
        "answer",
        "word_needs_space",
        "word_then_char",
        "incomplete_special",
        "json_prefix",
    ],
)
def test_encode_literal_ids_greedy_longest_match(text, expected):
    tok = CharTokenizer()
    assert tok.encode(text) == expected


@pytest.mark.parametrize(
    ("text", "offset"),
    [("café", 3), ("a\tb", 1), ("\x00", 0), ("<|im_end|>ü", 10)],
    ids=["accent", "tab", "nul", "after_special"],
)
def test_unknown_character_raises(text, offset):
    tok = CharTokenizer()
    with pytest.raises(ValueError, match=f"at offset {offset} is not in the vocabulary"):
        tok.encode(text)


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("a\tb", "a b"),
        ("café", "caf?"),
        ("line\r\n", "line \n"),
        ("no\u00a0break", "no break"),
        ("<|im_end|>ü😀\x00", "<|im_end|>???"),
        (CHAT, CHAT),
    ],
    ids=["tab", "accent", "carriage_return", "no_break_space", "after_special", "in_vocabulary"],
)
def test_fold_spells_text_in_the_vocabulary_one_character_for_one(text, folded):
    """Text from outside the run: whitespace the vocabulary lacks becomes a space, any
    other character it lacks ``?``; what it has is kept, so the round trip is exact."""
    tok = CharTokenizer()
    assert tok.fold(text) == folded and len(folded) == len(text)
    assert tok.decode(tok.encode(folded)) == folded


def test_client_text_is_folded_only_by_a_tokenizer_that_folds():
    from tunix_agentic.models.tokenizer import encode_client_text

    tok = CharTokenizer()
    assert encode_client_text(tok, "a\tb") == tok.encode("a b")

    class Whole:  # a tokenizer that spells everything (a Hugging Face one)
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    assert encode_client_text(Whole(), "a\tb") == [97, 9, 98]


@pytest.mark.parametrize("size", [1, 64, NATURAL_SIZE - 1], ids=["one", "64", "natural_minus_1"])
def test_vocab_size_below_natural_raises(size):
    with pytest.raises(ValueError, match=f"vocab_size={size} is below the {NATURAL_SIZE} tokens"):
        CharTokenizer(vocab_size=size)


def test_padded_vocab_extra_ids_decode_to_empty():
    tok = CharTokenizer(vocab_size=128)
    assert tok.vocab_size == 128
    assert tok.decode([44, NATURAL_SIZE, 127, 45]) == "AB"
    assert CharTokenizer(vocab_size=NATURAL_SIZE).vocab_size == NATURAL_SIZE


@pytest.mark.parametrize(
    ("vocab_size", "bad_id"),
    [(None, -1), (None, NATURAL_SIZE), (128, 128), (128, 10_000)],
    ids=["negative", "natural_size", "padded_size", "huge"],
)
def test_decode_out_of_range_raises(vocab_size, bad_id):
    tok = CharTokenizer(vocab_size=vocab_size)
    with pytest.raises(ValueError, match=f"token id {bad_id} outside vocabulary"):
        tok.decode([11, bad_id])


def test_decode_accepts_numpy_ids():
    tok = CharTokenizer()
    ids = np.asarray(tok.encode("<answer>42</answer>"), np.int32)
    assert tok.decode(ids) == "<answer>42</answer>"


def test_pad_eos_im_end_ids_are_distinct():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.eos_id, tok.im_end_id) == (0, 1, 3)
    assert tok.decode([tok.pad_id, tok.eos_id, tok.im_end_id]) == "<pad><|endoftext|><|im_end|>"


def test_token_id_unknown_raises():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="unknown token '<tool>'"):
        tok.token_id("<tool>")
