"""The pieces a training run is built from, each a function of its config.

:class:`~tunix_agentic.trainer.Trainer` calls them in order: :func:`chat_template` and
:func:`run_sources` before any work (:func:`check_run_config` and the sources' checks:
what can be found wrong without computing, as a
:class:`~tunix_agentic.config.ConfigError` naming the key), then :func:`build_engine`
and :func:`warm_start` (the SFT warm start on the sources' demonstrations).
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.config import ConfigError, RunConfig
from tunix_agentic.data.demos import demonstration_batches
from tunix_agentic.data.run_inputs import run_task_sources, run_template
from tunix_agentic.data.sources import RunSources
from tunix_agentic.env_checks import check_sources
from tunix_agentic.inference.base import InferenceEngine
from tunix_agentic.inference.config import EngineBackend
from tunix_agentic.inference.cross_policy import CrossPolicyEngine
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.inference.pool import EnginePool
from tunix_agentic.learners.batching import pack_sft_rows, sft_batch
from tunix_agentic.learners.sft import SFTTrainer
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.metrics.trace import ProfileSteps
from tunix_agentic.models.tokenizer import Tokenizer
from tunix_agentic.models.transformer import Transformer
from tunix_agentic.rollout.client.connect import service_api_key
from tunix_agentic.serving.client import SGLangEngine
from tunix_agentic.serving.http import is_loopback
from tunix_agentic.sharding import make_mesh
from tunix_agentic.signals import Stopped

_log = logging.getLogger(__name__)


def chat_template(config: RunConfig, tokenizer: Tokenizer) -> ChatFormat:
    """The model's chat template with ``agent``'s template options, as a rollout node
    builds it (:func:`~tunix_agentic.data.run_inputs.run_template`)."""
    try:
        return run_template(config, tokenizer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def run_sources(
    config: RunConfig, template: ChatFormat, profile_steps: ProfileSteps | None = None
) -> RunSources:
    """The run's task sources, with everything about the run checked that can be before
    any work (:func:`check_run_config`; each source's seeds and splits, one ``reset`` per
    source against its demonstrations, their lengths: ``env_checks``)."""
    try:
        sources = run_task_sources(config)  # as a rollout node builds them
        sources.train_stream(config.seed)  # seeds and splits
        check_sources(sources, template, config)  # reset vs demos, lengths
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_run_config(config, sources, profile_steps)
    return sources


def check_run_config(
    config: RunConfig, sources: RunSources, profile_steps: ProfileSteps | None = None
) -> None:
    """What the run's settings must agree on, checked before any work: demonstrations for
    ``sft.steps``, meshes whose devices exist, a rollout service that can be served, a
    ``--profile-steps`` window within the run."""
    if profile_steps is not None and profile_steps.last > config.rl.steps:
        raise ConfigError(
            f"--profile-steps {profile_steps.first}:{profile_steps.last}: the run has "
            f"{config.rl.steps} RL steps (rl.steps)"
        )
    if config.sft.steps and not any(src.has_demonstrations for src in sources.sources.values()):
        raise ConfigError(
            f"sft.steps={config.sft.steps} but no task source "
            f"({', '.join(sources.specs)}) provides demonstrations: set sft.steps=0"
        )
    for name, mesh in (("learner.mesh", config.learner.mesh), ("engine.mesh", config.engine.mesh)):
        if not mesh.trivial:
            try:  # the devices exist and fit, before any work
                make_mesh(mesh)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
    for where, steps, opt in (
        ("sft", config.sft.steps, config.sft.optimizer),
        ("learner", config.rl.steps, config.learner.optimizer),
    ):
        if (warning := lr_decay_warning(where, steps, opt)) is not None:
            _log.warning(warning)
    service = config.rollout.service
    _check_backend(config)
    if service.enabled and not service.engine_urls and config.cross_policy.stale_engines:
        raise ConfigError(
            "cross_policy.stale_engines must be 0 with rollout.service.urls (the nodes are "
            "served the trainer's one engine; name more in rollout.service.engine_urls)"
        )
    if service.enabled and not service.engine_urls and not service_api_key(service):
        if not is_loopback(service.engine_host):
            raise ConfigError(
                f"rollout.service.engine_host={service.engine_host} is beyond loopback: "
                "set rollout.service.api_key (or $TUNIX_AGENTIC_API_KEY) to guard the engine"
            )
    if config.rollout.ray.enabled:
        from tunix_agentic.cluster.errors import require_ray

        require_ray()  # before any work: a ConfigError with the install line when missing


def _check_backend(config: RunConfig) -> None:
    """``engine.backend`` agrees with where rollout runs. A server backend's servers are
    ``engine.urls`` when rollout runs in the trainer's process; with rollout nodes they are
    ``rollout.service.engine_urls``, or (vLLM) ``rollout.ray.engines`` started by Ray."""
    engine, rollout = config.engine, config.rollout
    if engine.backend == "jax":
        return
    backend = f"engine.backend={engine.backend}"
    if rollout.service.enabled or rollout.ray.enabled:
        if engine.urls:
            raise ConfigError(
                f"{backend} with rollout nodes: name the nodes' engines in "
                "rollout.service.engine_urls, not engine.urls (those serve the trainer's "
                "process)"
            )
        if rollout.ray.engines and engine.backend == "sglang":
            raise ConfigError(
                "rollout.ray.engines starts our JAX engines (they speak SGLang's API): set "
                "engine.backend=jax, or name SGLang servers in rollout.service.engine_urls"
            )
        if rollout.ray.engines:
            from tunix_agentic.cluster.vllm_actor import vllm_options

            try:
                vllm_options(config)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        elif not rollout.service.engine_urls:
            ray = ", or rollout.ray.engines (vLLM servers Ray starts)"
            raise ConfigError(
                f"{backend} with rollout nodes needs the servers the nodes sample from: "
                f"rollout.service.engine_urls{ray if engine.backend == 'vllm' else ''}"
            )
    elif not engine.urls:
        start = (
            "start one with `tunix-agentic serve-vllm --model DIR`"
            if engine.backend == "vllm"
            else "an SGLang server or `tunix-agentic serve-engine`"
        )
        raise ConfigError(
            f"{backend} needs engine.urls (its servers): {start}, "
            f"then pass engine.urls=[http://127.0.0.1:PORT]"
        )
    if config.cross_policy.stale_engines:
        raise ConfigError(
            f"cross_policy.stale_engines needs the JAX engine (engine.backend=jax), "
            f"not {engine.backend}"
        )


def lr_decay_warning(where: str, steps: int, opt) -> str | None:
    """A warning when ``<where>.optimizer``'s cosine decay (``warmup_steps + decay_steps``)
    outlasts the ``steps`` the run trains (an overridden ``sft.steps`` keeps the decay set
    for the config's length): the learning rate is still high when training stops. None
    when there is no decay, no training, or the decay ends in time."""
    total = opt.warmup_steps + opt.decay_steps
    if not opt.decay_steps or not steps or total <= steps:
        return None
    into = max(steps - opt.warmup_steps, 0) / opt.decay_steps
    cosine = 0.5 * (1 + math.cos(math.pi * into))
    left = opt.final_lr_fraction + (1 - opt.final_lr_fraction) * cosine
    field = "sft.steps" if where == "sft" else "rl.steps"
    return (
        f"{where}.optimizer decays the learning rate over {total} steps (warmup_steps="
        f"{opt.warmup_steps} + decay_steps={opt.decay_steps}) but {field}={steps}: training "
        f"stops at {100 * left:.0f} % of the peak rate; to decay over the run, set "
        f"{where}.optimizer.decay_steps={max(steps - opt.warmup_steps, 1)}"
    )


def build_engine(
    config: RunConfig, model: Transformer, version: int, engine_urls: tuple[str, ...] = ()
) -> InferenceEngine:
    """The run's engine, made by ``engine.backend``'s factory (:data:`ENGINE_FACTORIES`)
    for the servers the run names: ``engine.urls``, else ``engine_urls`` (the run's Ray
    engines), else ``rollout.service.engine_urls``. The weights reach servers through
    ``rollout.service.weights_dir``, a directory they read.

    Raises :class:`~tunix_agentic.config.ConfigError` when a server backend (sglang,
    vllm) is named no servers."""
    backend = config.engine.backend
    servers = tuple(config.engine.urls or engine_urls or config.rollout.service.engine_urls)
    if backend != "jax" and not servers:
        raise ConfigError(
            f"engine.backend={backend} samples on servers but none is named: set engine.urls "
            "(or, with rollout nodes, rollout.service.engine_urls)"
        )
    return ENGINE_FACTORIES[backend](config, model, version, servers)


def in_process_engines(engine: InferenceEngine) -> list[JaxEngine]:
    """The JAX engines sampling in this process behind ``engine`` (as :func:`build_engine`
    made it): the engine itself, a cross-policy mix's engines, or none (clients of
    servers)."""
    if isinstance(engine, CrossPolicyEngine):
        return [e for e in engine.engines if isinstance(e, JaxEngine)]
    return [engine] if isinstance(engine, JaxEngine) else []


def _jax_engines(
    config: RunConfig, model: Transformer, version: int, servers: tuple[str, ...]
) -> InferenceEngine:
    """Ours. With ``servers`` (serve-engine processes: rollout.service.engine_urls or the
    run's Ray engines) a pool of clients of their SGLang-compatible API, which load our
    checkpoints; else in this process: one JAX engine, or a cross-policy mix of
    ``1 + cross_policy.stale_engines`` of them."""
    if servers:
        service = config.rollout.service
        key = service_api_key(service)
        return _pool(
            servers, lambda url: SGLangEngine(url, api_key=key, weights_dir=service.weights_dir)
        )
    engines = [
        JaxEngine(model, config.engine, version=version)
        for _ in range(1 + config.cross_policy.stale_engines)
    ]
    if len(engines) == 1:
        return engines[0]
    cp = config.cross_policy
    return CrossPolicyEngine(
        engines, stale_every=cp.stale_every, fresh_fraction=cp.fresh_fraction, seed=config.seed
    )


def _sglang_servers(
    config: RunConfig, model: Transformer, version: int, servers: tuple[str, ...]
) -> InferenceEngine:
    """Clients of SGLang's native API (SGLang or serve-engine), given the weights as
    safetensors: what SGLang and serve-engine both load."""
    options = _server_options(config, model)
    return _pool(servers, lambda url: SGLangEngine(url, **options))


def _vllm_servers(
    config: RunConfig, model: Transformer, version: int, servers: tuple[str, ...]
) -> InferenceEngine:
    """Clients of vLLM servers (``tunix-agentic serve-vllm``)."""
    from tunix_agentic.serving.vllm_client import VLLMEngine

    options = _server_options(config, model)
    return _pool(servers, lambda url: VLLMEngine(url, **options))


def _server_options(config: RunConfig, model: Transformer) -> dict[str, Any]:
    """The keywords of a server backend's client: the model's shape (the weights it is
    sent, the reply ids it accepts), the key and the weights directory."""
    service = config.rollout.service
    return {
        "model_cfg": model.cfg,
        "api_key": service_api_key(service),
        "weights_dir": service.weights_dir,
        "vocab_size": model.cfg.vocab_size,
    }


def _pool(servers: tuple[str, ...], client: Callable[[str], InferenceEngine]) -> EnginePool:
    return EnginePool([client(url) for url in servers], names=list(servers))


# ``engine.backend`` -> what makes the run's engine from the servers it names (none:
# sampling in this process, which only "jax" can).
EngineFactory = Callable[[RunConfig, Transformer, int, tuple[str, ...]], InferenceEngine]
ENGINE_FACTORIES: dict[EngineBackend, EngineFactory] = {
    "jax": _jax_engines,
    "sglang": _sglang_servers,
    "vllm": _vllm_servers,
}


def warm_start(
    config: RunConfig,
    sources: RunSources,
    template: ChatFormat,
    model: Transformer,
    metrics: MetricsRecorder,
    *,
    progress: bool = True,
    stop_requested: Callable[[], bool] = lambda: False,
) -> Transformer:
    """``sft.steps`` of SFT on the sources' demonstrations (``sft/loss`` and
    ``sft/token_accuracy`` every 50 steps and at the last); raises
    :class:`~tunix_agentic.signals.Stopped` between steps once ``stop_requested()``."""
    cfg = config.sft
    if cfg.steps == 0:
        return model
    trainer = SFTTrainer(model, cfg.optimizer)
    batches = demonstration_batches(
        sources.demo_sources(),
        template,
        seed=config.seed,
        batch_size=cfg.batch_size,
        tool_fraction=cfg.tool_fraction,
        context_rule=config.agent.context_rule,
        context_window=config.agent.context_window,
    )
    bar = tqdm(range(cfg.steps), desc="SFT warm start", disable=not progress, file=sys.stderr)
    for step in bar:
        if stop_requested():
            raise Stopped
        with metrics.span("sft_step"):
            rows = next(batches)
            batch = (pack_sft_rows if cfg.pack else sft_batch)(
                rows, pad_id=template.tokenizer.pad_id
            )
            out = trainer.train_step(batch)
        if step % 50 == 0 or step == cfg.steps - 1:
            metrics.scalars(
                {"sft/loss": out["loss"], "sft/token_accuracy": out["token_accuracy"]}, step
            )
            bar.set_postfix(loss=f"{out['loss']:.3f}")
    return trainer.state.model()
