"""Run by tests/test_sharding.py in a subprocess with fake CPU devices (and, for the
multi-host test, as one of several processes); prints one JSON line of results."""

from __future__ import annotations

import asyncio
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tunix_agentic.inference.engine import EngineConfig, JaxEngine
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.learners.batching import GRPOBatch
from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.learners.lora import LoRAConfig
from tunix_agentic.learners.state import OptimizerConfig
from tunix_agentic.models.transformer import ModelConfig, Transformer
from tunix_agentic.sharding import MeshConfig, make_mesh, replicated

MODEL = ModelConfig(
    vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    ffn_dim=64, qk_norm=True,
)  # fmt: skip
STEPS = 3


def batch(rows: int = 16, length: int = 32, seed: int = 0) -> GRPOBatch:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, MODEL.vocab_size, (rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.float32)
    for r in range(rows - 2):  # two padding rows
        start, stop = 8 + r % 5, length - r % 7
        mask[r, start:stop] = 1.0
    old = np.where(mask > 0, rng.normal(-4.2, 0.3, (rows, length)), 0).astype(np.float32)
    adv = rng.normal(0, 1, rows).astype(np.float32)
    adv[-2:] = 0
    return GRPOBatch.build(input_ids=ids, loss_mask=mask, old_logprobs=old, advantages=adv)


def learner_config(**kw) -> GRPOConfig:
    return GRPOConfig(
        optimizer=OptimizerConfig(learning_rate=1e-3), kl_coef=0.05, mi_pairs=4, mi_every=1, **kw
    )


def train(mesh, **kw) -> dict:
    model = Transformer(MODEL, rngs=nnx.Rngs(0))
    learner = GRPOLearner(model, learner_config(**kw), mesh=mesh)
    metrics = [learner.train_step(batch(seed=s)) for s in range(STEPS)]
    params = learner.params_for_engine()
    # Gathered onto every device (multi-host: every process can read it).
    gather = {"out_shardings": replicated(mesh)} if mesh is not None else {}
    flat = jax.jit(lambda t: jnp.concatenate([x.ravel() for x in jax.tree.leaves(t)]), **gather)(
        params
    )
    shardings = sorted(
        {str(x.sharding.spec) for x in jax.tree.leaves(learner.state.params)}
        if mesh is not None
        else set()
    )
    return {
        "loss": [m["loss"] for m in metrics],
        "grad_norm": [m["grad_norm"] for m in metrics],
        "mi": metrics[-1].get("collapse/mutual_information_nats"),
        "params": np.asarray(flat).tolist(),
        "specs": shardings,
    }


def master_dtype_check(mesh) -> dict:
    import dataclasses

    model = Transformer(dataclasses.replace(MODEL, dtype="bfloat16"), rngs=nnx.Rngs(0))
    config = dataclasses.replace(
        learner_config(), optimizer=OptimizerConfig(learning_rate=1e-3, master_dtype="float32")
    )
    learner = GRPOLearner(model, config, mesh=mesh)
    loss = learner.train_step(batch())["loss"]
    leaves = jax.tree.leaves(learner.state.params) + jax.tree.leaves(learner.state.opt_state)
    big = [x for x in leaves if x.ndim == 2]
    return {
        "loss": loss,
        "dtypes": sorted({str(x.dtype) for x in big}),
        "engine_dtypes": sorted(  # the weight matrices, back in the model's bf16
            {str(x.dtype) for x in jax.tree.leaves(learner.params_for_engine()) if x.ndim == 2}
        ),
        "sharded": all(
            len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated for x in big
        ),
    }


def generate(engine: JaxEngine, prompts: list[list[int]]) -> list[list[int]]:
    async def go():
        try:
            outs = await asyncio.gather(
                *(engine.generate(p, SamplingParams(max_new_tokens=12, temperature=0.0))
                  for p in prompts)
            )  # fmt: skip
            return [list(o.token_ids) for o in outs]
        finally:
            await engine.close()

    return asyncio.run(go())


def devices_mode() -> dict:
    """1 device vs 8: the learner (fsdp, fsdp x tp, micro-batched), the engine sharded,
    and a disaggregated learner -> engine weight sync."""
    devs = jax.devices()
    out = {"devices": len(devs)}
    out["one"] = train(make_mesh(MeshConfig(), devs[:1]))
    out["none"] = train(None)
    out["fsdp8"] = train(make_mesh(MeshConfig(fsdp=8)))
    out["fsdp4_tp2"] = train(make_mesh(MeshConfig(fsdp=4, tp=2)))
    out["fsdp2_micro4"] = train(make_mesh(MeshConfig(fsdp=2, devices="0:2")), micro_batch_rows=4)
    out["micro4_remat"] = train(None, micro_batch_rows=4, remat=True)
    # bf16 weights, float32 master copy and moments: sharded before they exist.
    out["master_fsdp8"] = master_dtype_check(make_mesh(MeshConfig(fsdp=8)))
    lora = LoRAConfig(rank=4, alpha=8.0)
    out["lora_one"] = train(make_mesh(MeshConfig(), devs[:1]), lora=lora)
    out["lora_fsdp4_tp2"] = train(make_mesh(MeshConfig(fsdp=4, tp=2)), lora=lora)
    # The engine: sharded vs one device, same greedy tokens.
    prompts = [[1, 5, 9, 13], [2, 4, 6], [7, 7, 7, 7, 7, 3]]
    cfg = EngineConfig(max_slots=4, max_seq_len=32, decode_steps=4)
    model = Transformer(MODEL, rngs=nnx.Rngs(1))
    out["engine_one"] = generate(JaxEngine(model, cfg), prompts)
    sharded = JaxEngine(model, cfg, mesh=make_mesh(MeshConfig(fsdp=2, tp=2, devices="4:8")))
    out["engine_spec_devices"] = sorted(
        {d.id for x in jax.tree.leaves(sharded._device_specs[0]) for d in x.sharding.device_set}
    )
    out["engine_sharded"] = generate(sharded, prompts)
    # Disaggregated: learner on 0:4 (fsdp 4), engine on 4:8 (tp 2 x fsdp 2); the update
    # is resharded onto the engine's devices.
    learner = GRPOLearner(
        Transformer(MODEL, rngs=nnx.Rngs(2)),
        learner_config(mesh=MeshConfig(fsdp=4, devices="0:4")),
    )
    learner.train_step(batch())
    engine = JaxEngine(
        Transformer(MODEL, rngs=nnx.Rngs(3)),
        dataclasses_replace(cfg, mesh=MeshConfig(fsdp=2, tp=2, devices="4:8")),
    )
    out["disagg_untrained"] = generate(
        JaxEngine(Transformer(MODEL, rngs=nnx.Rngs(3)), cfg), prompts
    )
    engine.update_weights(learner.params_for_engine(), 1)
    out["disagg_engine"] = generate(engine, prompts)
    out["disagg_reference"] = generate(JaxEngine(learner.policy_model(), cfg), prompts)
    # Colocated: the engine on the learner's own devices (0-3), laid out its own way.
    colocated = JaxEngine(
        Transformer(MODEL, rngs=nnx.Rngs(3)),
        dataclasses_replace(cfg, mesh=MeshConfig(fsdp=2, tp=2, devices="0:4")),
    )
    colocated.update_weights(learner.params_for_engine(), 1)
    out["coloc_engine"] = generate(colocated, prompts)
    out["disagg_engine_devices"] = sorted(
        {d.id for x in jax.tree.leaves(engine._scheduler.params) for d in x.sharding.device_set}
    )
    return out


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def multihost_mode(process_id: int, num_processes: int, port: int) -> dict:
    from tunix_agentic.sharding import initialize_distributed

    initialize_distributed(f"127.0.0.1:{port}", num_processes, process_id)
    mesh = make_mesh(MeshConfig(fsdp=-1))
    out = train(mesh)
    out.update(
        process=jax.process_index(),
        global_devices=jax.device_count(),
        local_devices=jax.local_device_count(),
    )
    jax.distributed.shutdown()
    return out


if __name__ == "__main__":
    if sys.argv[1] == "devices":
        result = devices_mode()
    elif sys.argv[1] == "reference":
        result = train(None)
    else:
        result = multihost_mode(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    print("RESULT " + json.dumps(result), flush=True)
