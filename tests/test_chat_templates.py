"""Tokenizers and chat templates: the built-in pair exported to Hugging Face format gives the
same ids; Jinja templates render as transformers renders them; observation deltas, appended
to the history, decode to what the full template renders (for an append-only template), and
a template that rewrites earlier turns never rewrites the history."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tunix_agentic.agent.chat import (
    BUILTIN_CHAT_TEMPLATE,
    ChatTemplate,
    JinjaChatTemplate,
    TemplateError,
    make_chat_template,
)
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.agent.tool_parser import format_tool_call
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.hf_tokenizer import HFTokenizer, save_char_tokenizer
from tunix_agentic.models.tokenizer import Tokenizer
from tunix_agentic.models.tokenizers import load_tokenizer
from tunix_agentic.testing import arithmetic_demonstration as demonstration

TOOLS = ArithmeticEnv().tool_schemas()
CHAR = CharTokenizer(128)


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    return save_char_tokenizer(
        CHAR, tmp_path_factory.mktemp("char"), chat_template=BUILTIN_CHAT_TEMPLATE
    )


def test_the_built_in_tokenizer_exported_gives_the_same_ids(char_dir):
    hf = HFTokenizer.from_dir(char_dir)
    assert isinstance(hf, Tokenizer) and isinstance(CHAR, Tokenizer)
    texts = [
        "<|im_start|>user\nCompute 12 * (3 + 4).<|im_end|>\n<|im_start|>assistant\n",
        format_tool_call("calculator", {"expression": "12*(3+4)"}) + "<|im_end|>",
        "<tool_response>84</tool_response><answer>84</answer>",
        'user assistant systemic calculatorx Compute  {"name": "a"}',
        "<|im_end|><|im_end|><tool_call></tool_call>\n\n",
    ]
    for text in texts:
        ids = CHAR.encode(text)
        assert hf.encode(text) == ids, text
        assert hf.decode(ids) == text
    assert hf.stop_ids == CHAR.stop_ids and hf.pad_id == CHAR.pad_id
    assert load_tokenizer("hf", str(char_dir)).encode("12+3") == CHAR.encode("12+3")


def test_the_built_in_framing_as_jinja_equals_the_built_in_template(char_dir):
    hf = HFTokenizer.from_dir(char_dir)
    jinja, builtin = make_chat_template(hf), ChatTemplate(CHAR)
    assert isinstance(jinja, JinjaChatTemplate)
    assert jinja.prompt_ids("Compute 2+3.", TOOLS) == builtin.prompt_ids("Compute 2+3.", TOOLS)
    tool_turn = [{"role": "tool", "content": "5"}, {"role": "tool", "content": "error: x"}]
    assert jinja.observation_ids(tool_turn) == builtin.observation_ids(tool_turn)
    assert jinja.observation_ids("try again") == builtin.observation_ids("try again")
    assert jinja.assistant_ids("<answer>5</answer>") == builtin.assistant_ids("<answer>5</answer>")
    assert jinja.stop_ids == builtin.stop_ids
    rng = np.random.default_rng(0)
    task = make_arithmetic_task(3, seed=1, split="train")
    for use_tool in (True, False):
        a = demonstration(task, jinja, use_tool=use_tool, rng=np.random.default_rng(1))
        b = demonstration(task, builtin, use_tool=use_tool, rng=np.random.default_rng(1))
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
        np.testing.assert_array_equal(a["loss_mask"], b["loss_mask"])
    del rng


# A Qwen3-style template of our own: tool schemas in the system turn, tool calls in
# <tool_call> blocks, consecutive tool outputs in one user turn, and the reasoning of
# assistant turns before the last user message dropped (not append-only with reasoning).
QWEN_STYLE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call tools:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.reasoning_content and loop.index0 > ns.last_user %}<think>{{ m.reasoning_content }}</think>
{% endif %}{{ m.content }}
{%- for call in m.tool_calls or [] %}<tool_call>{{ call | tojson }}</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}
<tool_response>
{{ m.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A small byte-level BPE trained here on generated chat text, with QWEN_STYLE."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    specials += ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    rng = np.random.default_rng(0)
    corpus = [
        f"Compute {rng.integers(1000)} * {rng.integers(1000)}. The answer is {rng.integers(99)}."
        for _ in range(400)
    ] + [json.dumps(t) for t in TOOLS] * 20
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    out = tmp_path_factory.mktemp("bpe")
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": QWEN_STYLE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def _episode(template, turns):
    """Ids as a rollout builds them: the prompt, then per turn the model's ids (as if
    generated) and the observation's delta."""
    ids = template.prompt_ids("Compute 17 * 23.", TOOLS)
    for assistant_text, observation in turns:
        ids += template.assistant_ids(assistant_text)
        if observation is not None:
            ids += template.observation_ids(observation)
    return ids


def test_deltas_decode_to_the_full_render_of_an_append_only_conversation(bpe_dir):
    tok = HFTokenizer.from_dir(bpe_dir)
    template = make_chat_template(tok)
    call = format_tool_call("calculator", {"expression": "17*23"})
    turns = [
        (call, [{"role": "tool", "content": "391"}]),
        (
            "Checking.",
            [{"role": "tool", "content": "error: bad"}, {"role": "tool", "content": "1"}],
        ),
        ("<answer>391</answer>", None),
    ]
    history = tok.decode(_episode(template, turns))
    messages = [{"role": "user", "content": "Compute 17 * 23."}]
    for text, observation in turns:
        messages.append({"role": "assistant", "content": text})
        messages += observation or []
    full = template.render(messages, tools=TOOLS)
    assert full.endswith("<|im_end|>\n") and history == full[: -len("\n")]
    assert '"name": "calculator"' in history.split("<|im_end|>")[0]  # tools advertised


def test_a_template_that_drops_earlier_reasoning_never_rewrites_the_history(bpe_dir):
    """Qwen3-style templates drop the <think> of assistant turns before the last user
    message. The history keeps what the model generated (the engine's ids); the full
    render of the same conversation differs exactly by the dropped reasoning."""
    tok = HFTokenizer.from_dir(bpe_dir)
    template = make_chat_template(tok)
    thought = "<think>multiply</think>\n"
    ids = template.prompt_ids("Compute 2 * 3.", TOOLS)
    ids += template.assistant_ids(thought + "<answer>6</answer>")
    ids += template.observation_ids("Now compute 4 * 5.")  # a new user message
    history = tok.decode(ids)
    messages = [
        {"role": "user", "content": "Compute 2 * 3."},
        {"role": "assistant", "content": "<answer>6</answer>", "reasoning_content": "multiply"},
        {"role": "user", "content": "Now compute 4 * 5."},
    ]
    full = template.render(messages, tools=TOOLS, add_generation_prompt=True)
    assert "<think>multiply</think>" in history and "<think>" not in full
    assert history.replace(thought, "") == full


def test_our_render_equals_transformers_apply_chat_template(bpe_dir, char_dir):
    transformers = pytest.importorskip("transformers")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Compute 2 * 3."},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": "6"},
        {"role": "tool", "content": "7"},
    ]
    for directory in (bpe_dir, char_dir):
        ours = make_chat_template(HFTokenizer.from_dir(directory))
        theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
        for tools in (None, TOOLS):
            want = theirs.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
            assert ours.render(messages, tools=tools, add_generation_prompt=True) == want


def test_a_template_without_a_stop_token_at_the_end_of_a_turn_is_refused(char_dir):
    hf = HFTokenizer.from_dir(char_dir)
    with pytest.raises(TemplateError, match="stop token"):
        JinjaChatTemplate(hf, "{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(TemplateError, match="refused: no"):
        JinjaChatTemplate(hf, "{{ raise_exception('no') }}")


def test_template_kwargs_reach_the_template(bpe_dir):
    tok = HFTokenizer.from_dir(bpe_dir)
    source = (
        tok.chat_template
        + "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    )
    off = JinjaChatTemplate(tok, source, kwargs={"enable_thinking": False})
    plain = JinjaChatTemplate(tok, source)
    assert tok.decode(off.prompt_ids("hi")).endswith("<think></think>")
    assert not tok.decode(plain.prompt_ids("hi")).endswith("</think>")
    assert AgentConfig(enable_thinking=False).template_kwargs() == {"enable_thinking": False}
    assert AgentConfig().template_kwargs() == {}


def test_a_hugging_face_tokenizer_without_a_template_is_refused(bpe_dir, tmp_path):
    config = json.loads((bpe_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text((bpe_dir / "tokenizer.json").read_text())
    with pytest.raises(TemplateError, match="no chat template"):
        make_chat_template(HFTokenizer.from_dir(tmp_path))
