"""Command line: ``tunix-agentic train [--config PATH] [--resume RUN_DIR] [key.path=value ...]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_CONFIG = "configs/calculator_tiny.yaml"


def _default_config() -> str | None:
    path = Path(DEFAULT_CONFIG)
    return str(path) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tunix-agentic", description="RL post-training for tool-using agents"
    )
    sub = parser.add_subparsers(dest="command", required=True)
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
        "overrides", nargs="*", help="dotted overrides, e.g. rl.steps=20 rollout.group_size=4"
    )
    args = parser.parse_args(argv)

    if args.command == "train":
        from tunix_agentic.trainer import train

        try:
            config = (
                args.config
                if args.config is not None
                else (None if args.resume else _default_config())
            )
            result = train(
                config, list(args.overrides), resume_dir=args.resume, progress=not args.quiet
            )
        except ValueError as exc:
            print(f"tunix-agentic: error: {exc}", file=sys.stderr)
            return 2
        print(result.summary())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
