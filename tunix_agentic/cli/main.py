"""Command line.

``tunix-agentic train [--config PATH] [--resume RUN_DIR] [--profile-steps A:B] [key.path=value ...]``
``tunix-agentic export RUN_DIR --to OUT_DIR [--dtype bfloat16]``
``tunix-agentic eval RUN_DIR [--step N] [--tasks K] [--show K]`` (held-out figures of a checkpoint)
``tunix-agentic show RUN_DIR [--step N] [--heldout] [--task ID]`` (the episodes a run kept)
``tunix-agentic report RUN_DIR [--out DIR]`` (PNGs and report.md with a bottleneck verdict)
``tunix-agentic convert --gguf FILE --to OUT_DIR [--dtype bfloat16]``
``tunix-agentic compare --config RUN.yaml --against trl [--steps N] [--out DIR]`` (vs TRL)
``tunix-agentic aot --config RUN.yaml --topology v5e:2x4 [--json FILE] [key.path=value ...]``
(compile for a TPU that is not here: memory per chip, FLOPs, fit)
``tunix-agentic serve-engine [--config PATH] [--params DIR] [--host H] [--port P]
[--api-key KEY] [--weights-dir DIR ...] [--header-timeout S] [--body-timeout S] [key.path=value ...]``
``tunix-agentic serve-vllm --model DIR [--port P] [--python EXE] [--max-model-len N]`` (a real
vLLM server for ``engine.backend: vllm``; loopback only)
``tunix-agentic sandbox [--config PATH] [--backend auto|bwrap|process] [--timeout S] -- CMD ...``
``tunix-agentic serve-env --env NAME [--config PATH] [--sandbox-backend B] [--import MODULE ...]
[--host H] [--port P] [--api-key KEY] [--header-timeout S] [--body-timeout S]``
``tunix-agentic serve-rollout [--config PATH] [--engine-url URL ...] [--state-dir DIR] [--repair-log]
[--host H] [--port P] [--api-key KEY] [--admin-key KEY] [--max-queued N] [--max-task-kb KB] [--max-claims N]
[--max-log-mb MB] [--header-timeout S] [--body-timeout S] [key.path=value ...]``

Give the servers' API key in ``$TUNIX_AGENTIC_API_KEY``: ``--api-key`` works, but a
command line is readable by every user of the machine (``/proc/PID/cmdline``, ``ps``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from tunix_agentic.aot.cli import add_aot
from tunix_agentic.cli.eval_cmd import add_eval
from tunix_agentic.cli.platforms import keep_jax_off_absent_tpu
from tunix_agentic.cli.show import add_show
from tunix_agentic.cli.vllm_cmd import add_serve_vllm
from tunix_agentic.compare.cli import add_compare
from tunix_agentic.report import add_report

DEFAULT_CONFIG = "configs/calculator_tiny.yaml"
API_KEY_HELP = (
    "require 'Authorization: Bearer KEY' on every route but /health; prefer setting "
    "$TUNIX_AGENTIC_API_KEY (a command line is visible to every user in /proc/PID/cmdline)"
)


def _add_timeouts(parser: argparse.ArgumentParser) -> None:
    from tunix_agentic.serving.timeouts import ServerTimeouts

    default = ServerTimeouts()
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=default.header_s,
        metavar="S",
        help="close a connection whose request head is not complete after S seconds "
        f"(default {default.header_s:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=default.body_s,
        metavar="S",
        help=f"answer 408 to a request body not received in S seconds (default {default.body_s:g})",
    )


def _timeouts(args: argparse.Namespace):
    """The servers' :class:`ServerTimeouts` from ``--header-timeout`` / ``--body-timeout``
    (ValueError naming the flag)."""
    from tunix_agentic.serving.timeouts import ServerTimeouts

    for flag, value in (
        ("--header-timeout", args.header_timeout),
        ("--body-timeout", args.body_timeout),
    ):
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{flag} must be a finite number of seconds > 0, got {value}")
    return ServerTimeouts(header_s=args.header_timeout, body_s=args.body_timeout)


def _warn_api_key_flag(args: argparse.Namespace) -> None:
    if args.api_key is not None:
        print(
            "tunix-agentic: warning: --api-key KEY is readable by every user of this machine "
            "(/proc/PID/cmdline, ps); set TUNIX_AGENTIC_API_KEY instead",
            file=sys.stderr,
        )


def _default_config() -> str | None:
    """configs/calculator_tiny.yaml of the working directory, else of this checkout.

    Outside the repository (an editable install run from elsewhere) the default run
    must still be the documented one, not the library's bare dataclass defaults.
    """
    for path in (Path(DEFAULT_CONFIG), Path(__file__).resolve().parents[2] / DEFAULT_CONFIG):
        if path.is_file():
            return str(path)
    print(
        f"tunix-agentic: no {DEFAULT_CONFIG} here or beside the package; "
        "using the built-in defaults (pass --config PATH)",
        file=sys.stderr,
    )
    return None


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per job, each with its handler as ``args.handler``."""
    parser = argparse.ArgumentParser(
        prog="tunix-agentic", description="RL post-training for tool-using agents"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_train,
        _add_serve_engine,
        _add_serve_env,
        _add_serve_rollout,
        _add_export,
        _add_sandbox,
        _add_convert,
        add_eval,
        add_compare,
        add_report,
        add_show,
        add_aot,
        add_serve_vllm,
    ):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Without a TPU, JAX stays on the CPU without the TPU runtime's five error lines.
    keep_jax_off_absent_tpu(args.command)
    return args.handler(args)


def _add_train(sub) -> None:
    tr = sub.add_parser(
        "train", help="SFT warm start, then asynchronous GRPO, with held-out evaluation"
    )
    tr.add_argument(
        "--config", default=None, help=f"YAML run config (default: {DEFAULT_CONFIG} if present)"
    )
    tr.add_argument(
        "--resume", metavar="RUN_DIR", default=None, help="continue the run saved in RUN_DIR"
    )
    tr.add_argument("--quiet", action="store_true", help="no progress bars")
    tr.add_argument(
        "--profile-steps",
        metavar="A:B",
        type=_profile_steps,
        default=None,
        help="take a jax.profiler trace of RL steps A to B into RUN_DIR/tensorboard",
    )
    tr.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. rl.steps=20 rollout.group_size=4"
    )
    tr.set_defaults(handler=_train)


def _add_serve_engine(sub) -> None:
    se = sub.add_parser(
        "serve-engine", help="serve the JAX engine over HTTP with SGLang's native API"
    )
    se.add_argument(
        "--config",
        default=None,
        help=f"YAML run config (default: DIR/config.yaml of a run dir given as --params, "
        f"else {DEFAULT_CONFIG} if present)",
    )
    se.add_argument(
        "--params",
        metavar="DIR",
        default=None,
        help="parameters written by save_params, or a run dir (its latest checkpoint)",
    )
    se.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (beyond loopback an API key is required)",
    )
    se.add_argument("--api-key", default=None, metavar="KEY", help=API_KEY_HELP)
    se.add_argument(
        "--weights-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory /update_weights_from_disk may load from (repeatable; none: it loads nothing)",
    )
    se.add_argument("--port", type=int, default=30000, help="port to listen on (0: a free one)")
    _add_timeouts(se)
    se.add_argument("overrides", nargs="*", help="dotted overrides, e.g. engine.max_slots=16")
    se.set_defaults(handler=_serve_engine)


def _add_serve_env(sub) -> None:
    sv = sub.add_parser("serve-env", help="serve a registered environment over HTTP")
    sv.add_argument("--env", required=True, metavar="NAME", help="the environment to serve")
    sv.add_argument(
        "--config",
        default=None,
        metavar="PATH",
        help="YAML run config: its env.sandbox section is every episode's sandbox (as "
        "`tunix-agentic sandbox --config PATH` shows it; default: the built-in sandbox), "
        "env.tool_timeout_s and, when env.name is NAME, env.kwargs its factory keywords. "
        "Clients may set only the keywords NAME was registered to take from them "
        "(client_kwargs); any other, the sandbox included, is refused with a 400",
    )
    sv.add_argument(
        "--sandbox-backend",
        default=None,
        choices=["auto", "bwrap", "process"],
        help="replaces env.sandbox.backend of --config",
    )
    sv.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, so that it registers its environments (repeatable)",
    )
    sv.add_argument(
        "--host", default="127.0.0.1", help="address (beyond loopback an API key is required)"
    )
    sv.add_argument("--port", type=int, default=8100, help="port to listen on (0: a free one)")
    sv.add_argument("--api-key", default=None, metavar="KEY", help=API_KEY_HELP)
    sv.add_argument(
        "--idle-timeout", type=float, default=600.0, help="close episodes idle this many seconds"
    )
    _add_timeouts(sv)
    sv.set_defaults(handler=_serve_env)


def _add_serve_rollout(sub) -> None:
    sr = sub.add_parser(
        "serve-rollout",
        help="a rollout node: run groups submitted over HTTP against engines by URL (no JAX)",
    )
    sr.add_argument(
        "--config",
        default=None,
        metavar="PATH",
        help=f"YAML run config: its tasks, env (sandbox included), model tokenizer, agent and "
        f"rollout settings are fixed at start (default: {DEFAULT_CONFIG} if present)",
    )
    sr.add_argument(
        "--engine-url",
        dest="engine_urls",
        action="append",
        default=[],
        metavar="URL",
        help="an SGLang-compatible engine server (serve-engine, SGLang, sglang-router); "
        "repeatable; more can be added at run time with POST /v1/engines",
    )
    sr.add_argument(
        "--state-dir",
        default="runs/rollout_node",
        metavar="DIR",
        help="where the write-ahead log of finished groups lives (restart on the same DIR "
        "to serve them again); default runs/rollout_node",
    )
    sr.add_argument(
        "--repair-log",
        action="store_true",
        help="before serving, drop the damaged lines of DIR's log (printing each); a "
        "damaged log otherwise stops the node with an error naming the line",
    )
    sr.add_argument(
        "--host", default="127.0.0.1", help="address (beyond loopback an API key is required)"
    )
    sr.add_argument("--port", type=int, default=8200, help="port to listen on (0: a free one)")
    sr.add_argument("--api-key", default=None, metavar="KEY", help=API_KEY_HELP)
    sr.add_argument(
        "--engine-api-key",
        default=None,
        metavar="KEY",
        help="the engines' API key (default: the node's)",
    )
    sr.add_argument(
        "--max-groups",
        type=int,
        default=None,
        metavar="N",
        help="groups run at once; the rest wait, higher priority first (default: as many "
        "as fill the config's rollout INIT, RUN and EVAL pools)",
    )
    sr.add_argument(
        "--admin-key",
        default=None,
        metavar="KEY",
        help="the operator's key (better: $TUNIX_AGENTIC_ADMIN_KEY), apart from the API key: "
        "POST/DELETE /v1/engines, POST /v1/policy and DELETE /v1/groups/ID need it. Default: "
        "a random token the node leaves, for its own user only, where a trainer on this "
        "machine finds it; give one when the trainer runs elsewhere",
    )
    sr.add_argument(
        "--max-queued",
        type=int,
        default=1024,
        metavar="N",
        help="groups waiting for a slot; more answer 429 (default 1024)",
    )
    sr.add_argument(
        "--max-task-kb",
        type=int,
        default=1024,
        metavar="KB",
        help="a group's inline task as JSON; larger answer 413 (default 1024; a task_ref "
        "is never large)",
    )
    sr.add_argument(
        "--max-log-mb",
        type=int,
        default=16384,
        metavar="MB",
        help="the state dir's log; past it new groups answer 429 (default 16384; 0: no cap)",
    )
    sr.add_argument(
        "--max-claims",
        type=int,
        default=256,
        metavar="N",
        help="external members one client (API key, or address without keys) holds claimed "
        "at once; more answer 429 (default 256)",
    )
    _add_timeouts(sr)
    sr.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.run_workers=32")
    sr.set_defaults(handler=_serve_rollout)


def _add_export(sub) -> None:
    ex = sub.add_parser(
        "export", help="write a run's latest checkpoint as a Hugging Face model directory"
    )
    ex.add_argument("run_dir", help="the run directory (holding config.yaml and checkpoints/)")
    ex.add_argument("--to", required=True, metavar="OUT_DIR", help="where to write it")
    ex.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="cast the weights (default: the run's model.dtype)",
    )
    ex.set_defaults(handler=_export)


def _add_convert(sub) -> None:
    cv = sub.add_parser(
        "convert", help="turn a GGUF file into a Hugging Face model directory (model.source: hf)"
    )
    cv.add_argument("--gguf", required=True, metavar="FILE", help="the GGUF file (llama, qwen3)")
    cv.add_argument("--to", required=True, metavar="OUT_DIR", help="where to write it")
    cv.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the weights' dtype (default float32: the dequantised values exactly)",
    )
    cv.set_defaults(handler=_convert)


def _convert(args: argparse.Namespace) -> int:
    try:
        from tunix_agentic.models.gguf import convert_gguf

        cfg = convert_gguf(args.gguf, args.to, dtype=args.dtype)
    except (ImportError, ValueError, FileNotFoundError) as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"converted {args.gguf} to {args.to} ({cfg.num_layers} layers, d_model {cfg.d_model}, "
        f"vocab {cfg.vocab_size}, {args.dtype}); train it with model.source=hf "
        f"model.path={args.to}"
    )
    return 0


def _add_sandbox(sub) -> None:
    sb = sub.add_parser("sandbox", help="run a command in the sandbox the agent's tools get")
    sb.add_argument("--config", default=None, help="YAML run config (its env.sandbox section)")
    sb.add_argument("--backend", default=None, choices=["auto", "bwrap", "process"])
    sb.add_argument(
        "--timeout", type=float, default=None, help="seconds (default: timeout_s; 0: none)"
    )
    sb.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    sb.set_defaults(handler=_sandbox)


def _sandbox(args: argparse.Namespace) -> int:
    from tunix_agentic.cli.sandbox import main as sandbox_main

    return sandbox_main(args.cmd, config=args.config, backend=args.backend, timeout=args.timeout)


def _export(args: argparse.Namespace) -> int:
    from tunix_agentic.config import ConfigError
    from tunix_agentic.export import export_run

    try:
        done = export_run(args.run_dir, args.to, dtype=args.dtype)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    print(f"exported step {done['step']} of {args.run_dir} to {done['out_dir']} ({done['dtype']})")
    return 0


def _serve_env(args: argparse.Namespace) -> int:
    from tunix_agentic.serving.env_server import serve_env_main

    _warn_api_key_flag(args)
    try:
        timeouts = _timeouts(args)
    except ValueError as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    return serve_env_main(
        args.env,
        imports=args.imports,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        idle_timeout_s=args.idle_timeout,
        config=args.config,
        sandbox_backend=args.sandbox_backend,
        timeouts=timeouts,
    )


def _serve_rollout(args: argparse.Namespace) -> int:
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.caps import NodeCaps
    from tunix_agentic.rollout.service.node_http import serve_rollout_main

    _warn_api_key_flag(args)
    try:
        timeouts = _timeouts(args)
        caps = NodeCaps(
            max_queued=args.max_queued,
            max_task_bytes=args.max_task_kb << 10,
            max_log_bytes=args.max_log_mb << 20,
            max_claims_per_client=args.max_claims,
        )
        config = args.config if args.config is not None else _default_config()
        run_config = load_config(config, list(args.overrides))
    except (ValueError, FileNotFoundError) as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    return serve_rollout_main(
        run_config,
        engine_urls=list(args.engine_urls),
        state_dir=args.state_dir,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        engine_api_key=args.engine_api_key,
        timeouts=timeouts,
        max_groups=args.max_groups,
        repair_log=args.repair_log,
        admin_key=args.admin_key,
        caps=caps,
    )


def _profile_steps(text: str):
    """``--profile-steps A:B``; argparse reports a ValueError's message under the flag."""
    from tunix_agentic.metrics.trace import ProfileSteps

    try:
        return ProfileSteps.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _train(args: argparse.Namespace) -> int:
    from tunix_agentic.config import ConfigError
    from tunix_agentic.run_context import NonFiniteLoss
    from tunix_agentic.trainer import RunInterrupted, train

    try:
        config = (
            args.config if args.config is not None else (None if args.resume else _default_config())
        )
        result = train(
            config,
            list(args.overrides),
            resume_dir=args.resume,
            progress=not args.quiet,
            profile_steps=args.profile_steps,
        )
    except ConfigError as exc:  # only the config's: any other failure shows its traceback
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except NonFiniteLoss as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 1
    print(result.summary())
    return 0


def _serve_engine(args: argparse.Namespace) -> int:
    from tunix_agentic.serving.http import run_server_main

    _warn_api_key_flag(args)

    def set_up(api_key: str | None) -> Callable[[], Awaitable[None]]:
        from tunix_agentic.config import load_config
        from tunix_agentic.export import engine_from_config
        from tunix_agentic.serving.engine_server import serve_engine

        timeouts = _timeouts(args)
        config = args.config
        if config is None and args.params is not None:
            saved = Path(args.params) / "config.yaml"
            config = str(saved) if saved.is_file() else None
        if config is None:
            config = _default_config()
        cfg = load_config(config, list(args.overrides))
        engine, info = engine_from_config(cfg, args.params)
        return lambda: serve_engine(
            engine,
            args.host,
            args.port,
            model_info=info,
            api_key=api_key,
            weight_dirs=args.weights_dir,
            timeouts=timeouts,
        )

    return run_server_main(args.host, args.port, args.api_key, set_up, refused=(FileNotFoundError,))


if __name__ == "__main__":
    sys.exit(main())
