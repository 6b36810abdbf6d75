"""The ``as_rendered`` context rule: contexts as a deployment that re-renders the conversation
shows them (a generation prompt's extra, such as Qwen3's empty think block under
``enable_thinking: false``, dropped from earlier turns), one learner row per turn. On the
built-in tokenizer exported with a template of that shape; test_qwen3_real.py checks the
real Qwen3 template through ``run_agent``."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_agentic.agent.chat import BUILTIN_CHAT_TEMPLATE, JinjaChatTemplate
from tunix_agentic.agent.context import as_rendered, context_rule_for, get_context_rule
from tunix_agentic.data.demos import demonstration_trajectory
from tunix_agentic.envs.calculator import ArithmeticTasks, make_arithmetic_task
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.hf_tokenizer import HFTokenizer, save_char_tokenizer

# Each turn opens with "<|im_start|>assistant\n"; the generation prompt adds "<think></think>".
THINKS = BUILTIN_CHAT_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\\n' }}", "{{ '<|im_start|>assistant\\n<think></think>' }}"
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    directory = tmp_path_factory.mktemp("char")
    return HFTokenizer.from_dir(
        save_char_tokenizer(CharTokenizer(128), directory, chat_template=THINKS)
    )


def test_as_rendered_trains_on_the_contexts_a_re_render_gives(tok):
    assert THINKS != BUILTIN_CHAT_TEMPLATE
    template = JinjaChatTemplate(tok, THINKS)
    assert tok.decode(template.generation_only_ids) == "<think></think>"
    assert JinjaChatTemplate(tok, BUILTIN_CHAT_TEMPLATE).generation_only_ids == ()
    task = make_arithmetic_task(4, seed=0, split="train")
    messages = ArithmeticTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)
    rendered = demonstration_trajectory(task.prompt, messages, template, context_rule="as_rendered")
    whole = demonstration_trajectory(task.prompt, messages, template)
    assert rendered.token_ids == whole.token_ids  # the history is what the engine saw
    rows = rendered.learner_rows()
    assert len(rows) == 2 and len(whole.learner_rows()) == 1
    # The conversation as a client holds it (this template drops tool_calls: their text).
    convo = [{"role": "user", "content": task.prompt}]
    for m in messages:
        text = template.assistant_message_text(m) if m["role"] == "assistant" else m["content"]
        convo.append({"role": m["role"], "content": text})
    for row, k in zip(rows, (1, 3), strict=True):
        want = template.render(convo[:k], add_generation_prompt=True)
        n = int(row["loss_mask"].argmax())
        assert tok.decode(row["input_ids"][:n].tolist()) == want
        assert want.count("<think></think>") == 1  # the generation prompt's own, kept
    # The rule's view of the finished episode: no block before any turn but a new one.
    last = as_rendered(whole, drop=template.generation_only_ids)
    assert tok.decode(last).count("<think></think>") == 0
    assert len(whole.token_ids) - len(last) == 2 * len(template.generation_only_ids)


def test_as_rendered_without_anything_to_drop_is_append_only(tok):
    task = make_arithmetic_task(1, seed=0, split="train")
    messages = ArithmeticTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)
    plain = JinjaChatTemplate(tok, BUILTIN_CHAT_TEMPLATE)
    traj = demonstration_trajectory(task.prompt, messages, plain, context_rule="as_rendered")
    assert len(traj.learner_rows()) == 1
    assert context_rule_for("append_only", plain) is get_context_rule("append_only")
    with pytest.raises(ValueError, match="unknown context rule 'rendered'"):
        context_rule_for("rendered", plain)
