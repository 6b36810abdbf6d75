"""``tunix-agentic compare``: the settings mapped to TRL's GRPOConfig, one batch through our
loss and TRL's own (``GRPOTrainer._compute_loss``) on the same weights, and the command
end to end on the tiny agent exported as a Hugging Face directory."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tunix_agentic.compare.batch import ParityBatch, split_for_trl
from tunix_agentic.compare.mapping import trl_mapping
from tunix_agentic.config import load_config
from tunix_agentic.testing import TINY_RUN_OVERRIDES, cli

CONFIG = "configs/calculator_tiny.yaml"


def _trl_or_skip():
    pytest.importorskip("trl", reason="trl is not installed (pip install -e .[compare])")


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """The built-in tiny agent (TINY_RUN_OVERRIDES' shape) exported as an HF directory,
    as `tunix-agentic export` writes it."""
    from flax import nnx

    from tunix_agentic.agent.chat import BUILTIN_CHAT_TEMPLATE
    from tunix_agentic.models.char_tokenizer import CharTokenizer
    from tunix_agentic.models.hf import save_hf
    from tunix_agentic.models.hf_tokenizer import save_char_tokenizer
    from tunix_agentic.models.transformer import Transformer

    cfg = load_config(CONFIG, list(TINY_RUN_OVERRIDES))
    out = tmp_path_factory.mktemp("tiny_hf")
    save_hf(Transformer(cfg.model, rngs=nnx.Rngs(0)), out)
    save_char_tokenizer(
        CharTokenizer(cfg.model.vocab_size), out, chat_template=BUILTIN_CHAT_TEMPLATE
    )
    return out


def _run_config(tiny_hf, *overrides):
    return load_config(
        CONFIG,
        [*TINY_RUN_OVERRIDES, "model.source=hf", f"model.path={tiny_hf}", *overrides],
    )


def _batch(tiny_hf, *, empty_row: bool = False) -> ParityBatch:
    """4 rows of 24 tokens: prompts of 8, 9 and 11 tokens, one row ending early, old
    logprobs off the model's (ratios away from 1, some clipped), a reference apart."""
    from tunix_agentic.compare.parity import reference_logprobs
    from tunix_agentic.models.hf import load_hf_model

    rng = np.random.default_rng(0)
    ids = rng.integers(3, 128, (4, 24)).astype(np.int32)
    mask = np.zeros((4, 24), np.float32)
    mask[:, 8:20] = 1.0
    mask[1, 16:] = 0.0
    mask[2, 8:11] = 0.0
    if empty_row:
        mask[3] = 0.0
    lp = reference_logprobs(load_hf_model(tiny_hf), ids, 1.0)
    old = (lp + rng.normal(0, 0.3, lp.shape).astype(np.float32)) * mask
    ref = lp + rng.normal(0, 0.2, lp.shape).astype(np.float32)
    adv = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    return ParityBatch(ids, mask, old, adv, ref)


def test_mapping_names_each_trl_argument_and_the_differences():
    cfg = load_config(CONFIG, [])
    mapping = trl_mapping(cfg)
    kw = mapping.kwargs()
    assert kw["loss_type"] == "dapo"  # token_mean
    assert (kw["epsilon"], kw["epsilon_high"], kw["beta"]) == (0.2, 0.28, 0.0)
    assert kw["num_generations"] == 8 and kw["per_device_train_batch_size"] == 64
    assert kw["learning_rate"] == 3e-4 and kw["lr_scheduler_type"] == "constant"
    assert kw["gradient_checkpointing"] is False  # learner.remat (TRL defaults to True)
    assert kw["shuffle_dataset"] is False  # TRL's step k draws our step k's prompts
    assert {"bessel_std", "single_turn"} <= set(mapping.differences)
    assert "loss_type = 'dapo'  <- learner.aggregation" in mapping.lines()
    bessel = trl_mapping(
        load_config(CONFIG, ["learner.advantage=grpo_bessel", "agent.max_turns=1"])
    )
    assert "bessel_std" not in bessel.differences and "single_turn" not in bessel.differences
    seq = trl_mapping(load_config(CONFIG, ["learner.aggregation=seq_mean_token_mean"]))
    assert seq.kwargs()["loss_type"] == "grpo" and "masked_rows" in seq.differences


def test_split_for_trl_keeps_positions_and_masks():
    mask = np.zeros((2, 6), np.float32)
    mask[0, 2:5] = 1.0
    mask[1, 3:4] = 1.0
    batch = ParityBatch(
        np.arange(12, dtype=np.int32).reshape(2, 6),
        mask,
        np.arange(12, dtype=np.float32).reshape(2, 6),
        np.array([1.0, -1.0], np.float32),
    )
    parts = split_for_trl(batch)
    assert parts["prompt_ids"].tolist() == [[0, 1], [6, 7]]
    assert parts["completion_ids"].tolist() == [[2, 3, 4, 5], [8, 9, 10, 11]]
    assert parts["tool_mask"].tolist() == [[1, 1, 1, 0], [0, 1, 0, 0]]
    assert parts["completion_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert parts["old_per_token_logps"].tolist() == [[2, 3, 4, 5], [8, 9, 10, 11]]


PARITY_CASES = [
    ("token_mean", 0.0, False),
    ("token_mean", 0.05, True),
    ("seq_mean_token_mean", 0.05, False),
    ("seq_mean_token_sum_norm", 0.0, False),
]


def test_sampler_gap_is_float_noise_for_the_models_logprobs_and_not_for_others(tiny_hf, tmp_path):
    """The sampler check: logprobs computed by our JAX model are TRL's own per-token
    logprobs of the same tokens (float noise); logprobs 0.25 off are reported as 0.25."""
    _trl_or_skip()
    import dataclasses

    from tunix_agentic.compare.parity import reference_logprobs
    from tunix_agentic.compare.report import sampler_lines
    from tunix_agentic.compare.trl_side import build_trainer, sampler_gap
    from tunix_agentic.models.hf import load_hf_model

    batch = _batch(tiny_hf)
    exact = reference_logprobs(load_hf_model(tiny_hf, dtype="float32"), batch.input_ids, 1.0)
    trainer = build_trainer(tiny_hf, trl_mapping(_run_config(tiny_hf)).kwargs(), out_dir=tmp_path)
    same = sampler_gap(trainer, dataclasses.replace(batch, old_logprobs=exact))
    assert same["tokens"] == int(batch.loss_mask.sum()) and same["max"] < 1e-4, same
    off = sampler_gap(trainer, dataclasses.replace(batch, old_logprobs=exact - 0.25))
    assert off["max"] == pytest.approx(0.25, abs=1e-4) and off["mean"] == pytest.approx(
        0.25, abs=1e-4
    )
    assert "same distribution" in sampler_lines(same)[-1]
    assert "distributions differ" in sampler_lines(off)[-1]


@pytest.mark.parametrize(
    "aggregation,kl_coef,ratio_corrected",
    PARITY_CASES,
    ids=["dapo", "dapo-kl-corrected", "grpo-kl", "dr_grpo"],
)
def test_loss_parity_with_trl_within_1e5(tiny_hf, aggregation, kl_coef, ratio_corrected):
    _trl_or_skip()
    from tunix_agentic.compare.parity import loss_parity

    cfg = _run_config(
        tiny_hf,
        f"learner.aggregation={aggregation}",
        f"learner.kl_coef={kl_coef}",
        f"learner.kl_ratio_corrected={str(ratio_corrected).lower()}",
        "learner.norm_length=40",  # = agent.max_new_tokens: TRL's max_completion_length
    )
    result = loss_parity(tiny_hf, _batch(tiny_hf), cfg.learner, trl_mapping(cfg))
    assert result.semantics_match
    assert abs(result.ours) > 1e-3  # a loss that checks something
    assert result.gap <= 1e-5, result.line()
    assert "equal within 1e-05" in result.line()


@pytest.mark.parametrize(
    "overrides,difference",
    [
        (("learner.aggregation=seq_mean_token_mean",), "masked_rows"),
        (
            ("learner.aggregation=seq_mean_token_sum_norm", "learner.norm_length=0"),
            "dr_grpo_normaliser",
        ),
    ],
    ids=["masked-rows", "dr-grpo-normaliser"],
)
def test_loss_parity_names_the_difference(tiny_hf, overrides, difference):
    _trl_or_skip()
    from tunix_agentic.compare.parity import loss_parity

    cfg = _run_config(tiny_hf, *overrides)
    batch = _batch(tiny_hf, empty_row=True)
    result = loss_parity(tiny_hf, batch, cfg.learner, trl_mapping(cfg))
    assert not result.semantics_match and difference in result.differences
    assert result.gap > 1e-5 and difference in result.line()
    # The named difference accounts for the whole gap.
    if difference == "masked_rows":  # 3 rows with tokens vs all 4
        assert result.trl == pytest.approx(result.ours * 3 / 4, rel=1e-4)
    else:  # (3 live rows x padded width 23) vs (4 rows x max_completion_length 40)
        assert result.trl == pytest.approx(result.ours * (3 * 23) / (4 * 40), rel=1e-4)


@pytest.mark.parametrize(
    "args,message",
    [
        (("--against", "torchrl"), "comparable peers are trl"),
        (("--against", "trl", "--steps", "0"), "--steps must be >= 1"),
        (("--against", "trl", "--heldout", "-1"), "--heldout must be >= 0"),
        (("--against", "trl"), "model.source=hf"),
        (("--against", "tunix"), "--against tunix is not built"),
    ],
    ids=["unknown-peer", "no-steps", "bad-heldout", "not-an-hf-model", "tunix-not-built"],
)
def test_compare_bad_input_exits_2(args, message, capsys):
    _trl_or_skip()
    from tunix_agentic.cli.main import main

    assert main(["compare", "--config", CONFIG, *args]) == 2
    assert message in capsys.readouterr().err


def test_compare_without_the_extra_says_how_to_install(monkeypatch, capsys):
    from tunix_agentic.cli.main import main

    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    assert main(["compare", "--config", CONFIG, "--against", "trl"]) == 2
    assert "pip install -e .[compare]" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_cli_writes_both_sides_and_the_parity(tiny_hf, tmp_path):
    _trl_or_skip()
    out = tmp_path / "cmp"
    argv = cli(
        "compare",
        "--config",
        CONFIG,
        "--against",
        "trl",
        "--steps",
        "2",
        "--heldout",
        "3",
        "--out",
        str(out),
        *TINY_RUN_OVERRIDES,
        "agent.max_new_tokens=16",
        "model.source=hf",
        f"model.path={tiny_hf}",
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "loss_type = 'dapo'" in proc.stdout  # the mapping is printed
    data = json.loads((out / "compare.json").read_text())
    for side in ("ours", "trl"):
        steps = data[side]["steps"]
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["step_s"] > 0 and s["generated_tokens"] > 0 for s in steps)
        # Ours: the engine's busy seconds in the step (0 when its batch was made earlier).
        assert all(s["generation_s"] >= 0 for s in steps)
        assert data[side]["peak_rss_mb"] > 0
        # Held-out success before RL and after the last step (ours may skip step 1 when
        # its weights were superseded before an evaluation could measure them).
        held = data[side]["heldout_success"]
        assert {"0", "2"} <= set(held) and all(0 <= v <= 1 for v in held.values())
    assert set(data["trl"]["heldout_success"]) == {"0", "1", "2"}
    assert all(s["generation_s"] > 0 for s in data["trl"]["steps"])
    # TRL has no dynamic sampling: ours trains on unfiltered batches too.
    assert data["ours_fixed"]["rollout.filter_uniform_groups"].startswith("false")
    assert "ours: rollout.filter_uniform_groups=false" in proc.stdout
    assert data["trl_plays_single_turn"] is True  # calculator is multi-turn
    probe = data["loss_parity"]["probe"]
    assert probe["semantics_match"] and probe["equal"] and abs(probe["ours"]) > 0
    assert data["loss_parity"]["as_trained"]["equal"]
    # The tokens our engine sampled have TRL's probabilities (same weights, same temperature).
    gap = data["trl"]["sampler_logprob_gap"]
    assert gap["tokens"] > 0 and gap["max"] < 1e-3, gap
    md = (out / "compare.md").read_text()
    assert "loss parity" in md and "single-turn form" in md
    assert "Why: TRL " in md and "cannot parse tool calls" in data["trl"]["single_turn_why"]
    assert "Sampler check" in md and "same distribution" in md
    assert "bessel_std" in md and "held-out success" in md
    assert (out / "compare.png").stat().st_size > 0


def _side(rewards, held, **parts):
    steps = [
        {
            "step": i + 1,
            "reward_mean": r,
            "step_s": 10.0,
            "wait_for_batch_s": 1.0,
            "train_s": 6.0,
            "weight_sync_s": 0.5,
            "generation_s": 4.0,
            "reward_s": 0.25,
            "generated_tokens": 80.0,
            "tokens_per_s": 8.0,
            **parts,
        }
        for i, r in enumerate(rewards)
    ]
    return {"steps": steps, "heldout_success": held, "peak_rss_mb": 2048.0, "wall_s": 30.0}


def test_report_puts_reward_and_heldout_of_both_sides_per_step(tmp_path):
    from tunix_agentic.compare.parity import LossParity
    from tunix_agentic.compare.report import CompareResult, summary, write_report

    cfg = load_config(CONFIG, [])
    result = CompareResult(
        config="run.yaml",
        model="m",
        steps=2,
        mapping=trl_mapping(cfg),
        ours=_side([0.25, 0.5], {"0": 0.5, "2": 0.75}),
        # TRL's held-out success comes back from JSON with string keys too.
        trl=_side([0.0, 0.125], {"0": 0.5, "1": 0.5, "2": 0.625}, train_s=5.0),
        parity={"probe": LossParity(0.1, 0.1 + 1e-7, True, ())},
        multi_turn=False,
        out_dir=str(tmp_path),
        ours_fixed={"rollout.filter_uniform_groups": "false (no dynamic sampling on TRL's)"},
        heldout=8,
    )
    files = write_report(result, tmp_path)
    md = files["md"].read_text()
    assert "| 0 | | | 0.500 | 0.500 |" in md  # before RL
    assert "| 1 | 0.250 | 0.000 | n/a | 0.500 |" in md  # ours' step 1 not measured
    assert "| 2 | 0.500 | 0.125 | 0.750 | 0.625 |" in md
    assert "| held-out success, last evaluation | 0.750 | 0.625 | 1.20x |" in md
    assert "| training s per step | 6.000 | 5.000 | 1.20x |" in md
    assert "`rollout.filter_uniform_groups=false (no dynamic sampling on TRL's)`" in md
    assert summary(result.trl)["heldout_before"] == 0.5
    data = json.loads(files["json"].read_text())
    assert data["heldout_tasks"] == 8 and data["summary"]["ours"]["heldout_last"] == 0.75
    if "png" in files:  # matplotlib is in the dev extra
        assert files["png"].stat().st_size > 10_000


def test_heldout_success_comes_back_in_step_order_past_step_nine():
    """JSON keys are strings: sorted as such, step 10 came before step 2 and the report's
    held-out line was drawn back and forth."""
    from tunix_agentic.compare.report import heldout

    side = {"heldout_success": {str(k): k / 10 for k in (0, 10, 1, 2, 9, 11)}}
    assert list(heldout(side)) == [0, 1, 2, 9, 10, 11]
    assert heldout(side)[10] == 1.0


def test_why_trl_plays_one_turn_is_checked_against_trl_and_the_template(tiny_hf, tmp_path):
    """The built-in template is none TRL can parse calls from; with TRL's own Qwen3
    template in its place TRL could, and the reason says compare does not drive it."""
    _trl_or_skip()
    import shutil

    from trl.chat_template_utils import qwen3_chat_template

    from tunix_agentic.compare.trl_side import single_turn_why

    assert "cannot parse tool calls" in single_turn_why(str(tiny_hf))
    qwen = tmp_path / "qwen_template"
    shutil.copytree(tiny_hf, qwen)
    config = json.loads((qwen / "tokenizer_config.json").read_text())
    config["chat_template"] = qwen3_chat_template
    (qwen / "tokenizer_config.json").write_text(json.dumps(config))
    (qwen / "chat_template.jinja").unlink(missing_ok=True)
    why = single_turn_why(str(qwen))
    assert "could run this model's tool calls" in why and "cannot parse" not in why, why
