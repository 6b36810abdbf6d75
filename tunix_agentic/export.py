"""``tunix-agentic export``: a run's latest checkpoint as a Hugging Face model directory;
and the engine ``serve-engine`` serves from weights on disk (:func:`engine_from_config`).

What is written (safetensors, ``config.json``, tokenizer files) loads in
transformers and in SGLang, and back here through ``model.source: hf``. A run
of a Hugging Face model ships its original tokenizer files; a run of the
built-in model ships the character tokenizer in ``tokenizer.json`` form with
the built-in framing as its chat template, so the two give the same ids.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from tunix_agentic.agent.chat import BUILTIN_CHAT_TEMPLATE
from tunix_agentic.checkpoint import load_params, load_run_params
from tunix_agentic.config import ConfigError, RunConfig, load_config
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.learners.lora import init_adapters
from tunix_agentic.learners.lora import merge as lora_merge
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.hf import build_model, is_hf_dir, load_hf_model, save_hf
from tunix_agentic.models.hf_tokenizer import save_char_tokenizer
from tunix_agentic.models.transformer import Transformer


def load_run_policy(run_dir: str | Path, cfg: RunConfig) -> tuple[Transformer, int]:
    """The policy of a run's newest checkpoint (LoRA adapters merged) and its version.

    The one way a trained run's model is read outside training: ``export`` and
    ``serve-engine --params RUN_DIR`` both use it.
    """
    abstract = nnx.eval_shape(lambda: Transformer(cfg.model, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    lora = cfg.learner.lora
    if not lora.enabled:
        params, version = load_run_params(run_dir, state)
        return nnx.merge(graphdef, params), version
    adapters: Any = jax.eval_shape(lambda: init_adapters(state, lora, jax.random.key(0)))
    saved, version = load_run_params(run_dir, {"base": state, "adapters": adapters})
    params = lora_merge(saved["base"], saved["adapters"], lora.scale)
    return nnx.merge(graphdef, params), version


def export_run(run_dir: str | Path, out_dir: str | Path, *, dtype: str | None = None) -> dict:
    """Write ``run_dir``'s newest checkpoint to ``out_dir``; returns what was written."""
    run = Path(run_dir)
    saved = run / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run}: no config.yaml there (not a run directory)")
    if not (run / "checkpoints").is_dir():
        raise ConfigError(f"{run}: no checkpoints/ (nothing trained to export)")
    cfg = load_config(saved, [f"run_dir={run}"])
    out = Path(out_dir)
    if out.resolve() == Path(cfg.model.path or "/nonexistent").resolve():
        raise ConfigError(f"--to {out} is the model the run started from; choose another dir")
    model, version = load_run_policy(run, cfg)
    if cfg.model.source == "hf":
        source = json.loads((Path(cfg.model.path) / "config.json").read_text())
        save_hf(model, out, tokenizer_dir=cfg.model.path, dtype=dtype, base_config=source)
    else:
        save_hf(model, out, dtype=dtype)
        save_char_tokenizer(
            CharTokenizer(cfg.model.vocab_size), out, chat_template=BUILTIN_CHAT_TEMPLATE
        )
    return {"out_dir": str(out), "step": version, "dtype": dtype or cfg.model.dtype}


def engine_from_config(
    cfg: RunConfig, params_path: str | None = None
) -> tuple[JaxEngine, dict[str, Any]]:
    """Build the engine ``serve-engine`` serves, and its model info.

    ``params_path`` is a directory written by ``save_params``, a run
    directory (one holding ``checkpoints/``), whose latest checkpoint is
    served with its step as the weight version, or a Hugging Face model
    directory (its ``config.json`` gives the model's shape). Without it the
    model keeps its random initialisation from ``cfg.seed``. The engine of a
    built-in model gets the character tokenizer, so constrained decoding
    (``tool_choice``, ``response_format``) works over it. Raises
    FileNotFoundError or ValueError when the parameters cannot be loaded.
    """
    if params_path is not None and not Path(params_path).exists():
        raise FileNotFoundError(f"--params {params_path!r} does not exist")
    version = 0
    model_path = f"random-init(seed={cfg.seed})"
    path = None if params_path is None else Path(params_path)
    hf_params = path is not None and is_hf_dir(path)
    if hf_params:
        # At the checkpoint's own dtype (bf16 stays bf16), attention as configured.
        model = load_hf_model(path, attention=cfg.model.attention)
        cfg = dataclasses.replace(cfg, model=model.cfg)
    elif path is not None and (path / "checkpoints").is_dir():
        model, version = load_run_policy(path, cfg)  # no random init, no source weights read
    else:
        model = build_model(cfg.model, seed=cfg.seed)
        if path is not None:
            nnx.update(model, load_params(path, nnx.state(model, nnx.Param)))
    if path is not None:
        model_path = str(path.absolute())
    # The model's tokenizer directory: its end-of-sequence ids stop every request.
    tokenizer_path = ""
    if path is not None and (path / "tokenizer.json").is_file():
        tokenizer_path = str(path.absolute())
    elif cfg.model.source == "hf":
        tokenizer_path = str(Path(cfg.model.path).absolute())
    engine = JaxEngine(model, cfg.engine, version=version)
    if not tokenizer_path and not hf_params and cfg.model.source == "builtin":
        # The built-in characters are a grammar vocabulary as they are: tool_choice and
        # response_format are enforced over the built-in model too.
        engine.use_tokenizer(CharTokenizer(cfg.model.vocab_size))
    info = {
        "model_path": model_path,
        "tokenizer_path": tokenizer_path,
        "vocab_size": cfg.model.vocab_size,
        "max_seq_len": cfg.engine.max_seq_len,
        "max_slots": cfg.engine.max_slots,
    }
    return engine, info
