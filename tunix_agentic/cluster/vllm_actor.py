"""A real vLLM server as a Ray actor: the run's engines when ``engine.backend: vllm`` and
``rollout.ray.engines`` > 0.

:class:`VLLMActor` starts vLLM (:class:`~tunix_agentic.serving.vllm_server.VLLMServer`)
on loopback for the run's model (``model.path``, a Hugging Face directory: ``--dtype``
``model.dtype``, ``--max-model-len`` ``engine.max_seq_len``, ``--max-num-seqs``
``engine.max_slots``), with the run's API key, and serves it on its machine's address
through :mod:`~tunix_agentic.serving.vllm_guard`: every route behind the key, and weights
loaded only from the run's ``rollout.service.weights_dir`` (vLLM's own weight routes take
no key and load from any path). The trainer's engine pool and the rollout nodes talk to
the guard as to any vLLM (:class:`~tunix_agentic.serving.vllm_client.VLLMEngine`); the
weights arrive as they reach Ray's JAX engines (:mod:`.engine_actor`): written once into
the shared directory, reloaded by each server, pushed by a node to a server that came
back without them.

vLLM runs in its own process group, killed when the actor's process dies (a SIGKILL
included, through ``PR_SET_PDEATHSIG``), so a restarted actor never finds the last one's
server holding the memory. Its output goes to ``vllm.log`` in the actor's state dir.
Ray restarts a dead actor as it does the others: a new vLLM at the initial weights, on
the same port when that is free. vLLM takes tens of seconds to start on a CPU (minutes
when it compiles): raise ``rollout.ray.start_timeout_s`` to match.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tunix_agentic.cluster.server_thread import READY_TIMEOUT_S, ServerActor, ServerThread
from tunix_agentic.config import RunConfig, from_dict


def vllm_options(config: RunConfig) -> dict[str, Any]:
    """What :class:`~tunix_agentic.serving.vllm_server.VLLMServer` is started with for the
    run ``config`` (a :class:`~tunix_agentic.config.RunConfig`); ValueError naming the
    field when the model is not a Hugging Face directory."""
    model = config.model
    if model.source != "hf" or not model.path:
        raise ValueError(
            "engine.backend=vllm with rollout.ray.engines needs model.source=hf and "
            "model.path, a Hugging Face model directory every Ray node sees (tunix-agentic "
            f"convert makes one), got model.source={model.source!r} model.path={model.path!r}"
        )
    return {
        "model_dir": model.path,
        "dtype": model.dtype,
        "max_model_len": config.engine.max_seq_len,
        "max_num_seqs": config.engine.max_slots,
    }


class VLLMActor(ServerActor):
    """vLLM on loopback behind the guard on its machine's address, in a Ray actor (JAX is
    never loaded in it)."""

    def _thread(self, host: str, port: int) -> ServerThread:
        from tunix_agentic.serving.vllm_guard import start_guard
        from tunix_agentic.serving.vllm_server import VLLMServer

        spec = self.spec  # an EngineSpec
        # The config as written: no environment modules or model shape (that would load
        # JAX into a process whose machine's accelerator is vLLM's).
        options = vllm_options(from_dict(RunConfig, spec.config))
        server = VLLMServer(
            options.pop("model_dir"),
            host="127.0.0.1",
            api_key=spec.api_key,
            log_path=self.state_dir / "vllm.log",
            die_with_parent=True,
            **options,
        )

        async def setup() -> None:  # on the thread that lives as long as the actor
            server.start()
            await asyncio.to_thread(server.wait_ready, READY_TIMEOUT_S)

        async def serve(port: int):
            runner, real_port = await start_guard(
                server.url,
                host=host,
                port=port,
                api_key=spec.api_key,
                weight_dirs=[spec.weights_dir],
                upstream_key=spec.api_key,
            )
            return real_port, runner.cleanup

        async def teardown() -> None:
            await asyncio.to_thread(server.stop)

        return ServerThread(f"vllm {spec.name}", serve, port, setup=setup, teardown=teardown)
