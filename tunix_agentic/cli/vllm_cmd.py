"""``tunix-agentic serve-vllm --model DIR [--port P] [--python EXE] ...``: a real vLLM server
for a run's model, started with what ``engine.backend: vllm`` needs, its URL printed.

Loopback only: vLLM's weight routes (``/pause``, ``/collective_rpc``, ...) answer without
the API key (vLLM guards ``/v1`` and ``/inference`` only), and ``/collective_rpc`` loads
weights from any path it is given, so anyone who can reach the port could replace the
policy. Serve beyond the machine through a proxy that guards every route.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any


def add_serve_vllm(sub: Any) -> None:
    """Register ``serve-vllm`` on the CLI's sub-parsers."""
    sv = sub.add_parser(
        "serve-vllm",
        help="start a vLLM server for engine.backend=vllm (a real vLLM; loopback only)",
    )
    sv.add_argument("--model", required=True, metavar="DIR", help="a Hugging Face model dir")
    sv.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="default 8000; 0: a free port")
    sv.add_argument(
        "--python",
        default=None,
        metavar="EXE",
        help="the interpreter that has vLLM (default: $TUNIX_AGENTIC_VLLM_PYTHON, else this one)",
    )
    sv.add_argument("--max-model-len", type=int, default=None, help="the context window")
    sv.add_argument("--max-num-seqs", type=int, default=None, help="requests decoded at once")
    sv.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    sv.add_argument(
        "--kv-cache-gib",
        type=float,
        default=1.0,
        help="KV cache of vLLM's CPU build in GiB (VLLM_CPU_KVCACHE_SPACE; default 1)",
    )
    sv.add_argument(
        "--compile",
        action="store_true",
        help="vLLM's compiled mode instead of --enforce-eager (minutes to start on a CPU)",
    )
    sv.add_argument("extra", nargs=argparse.REMAINDER, help="-- more vLLM arguments")
    sv.set_defaults(handler=serve_vllm)


def serve_vllm(args: argparse.Namespace) -> int:
    from tunix_agentic.serving.http import is_loopback, resolve_api_key
    from tunix_agentic.serving.vllm_server import VLLMServer, VLLMUnavailable

    if not is_loopback(args.host):
        print(
            f"tunix-agentic: error: --host {args.host} is beyond loopback; vLLM's weight "
            "routes take no API key (put a proxy that guards every route in front instead)",
            file=sys.stderr,
        )
        return 2
    extra = [a for a in args.extra if a != "--"]
    try:
        server = VLLMServer(
            args.model,
            python=args.python,
            host=args.host,
            port=args.port,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            dtype=args.dtype,
            kv_cache_gib=args.kv_cache_gib,
            api_key=resolve_api_key(None),
            eager=not args.compile,
            extra=extra,
        )
    except (VLLMUnavailable, FileNotFoundError) as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    print(" ".join(server.cmd), file=sys.stderr)
    server.start()  # its output is ours

    def _exit(*_):  # stop() runs below, not here: the wait this interrupts holds a lock
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit)
    try:
        try:
            server.wait_ready()
        except RuntimeError as exc:
            print(f"tunix-agentic: error: {exc}", file=sys.stderr)
            return 1
        print(
            f"vLLM serving {args.model} at {server.url}; train with engine.backend=vllm "
            f"engine.urls=[{server.url}]",
            flush=True,
        )
        code = server.proc.wait() if server.proc else 0
    finally:
        server.stop()  # SIGTERM and Ctrl-C stop vLLM with us
    return 0 if code in (0, -signal.SIGTERM) else code
