"""A PNG of a run's TensorBoard CUSTOM SCALARS page, taken by a headless browser.

Starts the real ``tensorboard`` server on the run's event files (127.0.0.1, a free
port), waits until it serves the run's custom-scalars layout, loads the page in
headless Chromium and saves what it drew: a way to look at the dashboard a user
opens, without a desktop (the picture of it in docs/observability.md, ``docs/report/
tensorboard_custom_scalars.png``, is made this way). Not a test: it prints the PNG's
path and asserts nothing.

    python tools/screenshot_tensorboard.py runs/calculator_tiny
    python tools/screenshot_tensorboard.py RUN_DIR --out shot.png --width 1600 --height 3400

RUN_DIR is a run directory (its ``tensorboard/`` is read) or an event-file directory.
The browser: ``--browser PATH``, else the first of ``chromium-headless-shell``,
``chromium``, ``chromium-browser``, ``google-chrome`` on the PATH (Debian:
``apt-get install chromium-headless-shell``). TensorBoard's own defaults apply
(smoothing 0.6, "Ignore outliers in chart scaling" on), as a new user sees them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_browser(given: str | None) -> str:
    """The headless browser to use, or SystemExit saying how to get one."""
    if given is not None:
        path = shutil.which(given)
        if path is None:
            raise SystemExit(f"--browser {given}: no such executable")
        return path
    for name in BROWSERS:
        if (path := shutil.which(name)) is not None:
            return path
    raise SystemExit(
        f"no headless browser found (looked for {', '.join(BROWSERS)}); on Debian: "
        "apt-get install chromium-headless-shell"
    )


def event_dir(run_dir: Path) -> Path:
    """The directory TensorBoard reads: ``RUN_DIR/tensorboard`` or RUN_DIR itself (the
    event files are in the run's own directory below it, and its series' below that)."""
    for candidate in (run_dir / "tensorboard", run_dir):
        if candidate.is_dir() and any(candidate.rglob("*tfevents*")):
            return candidate
    raise SystemExit(f"{run_dir}: no TensorBoard event files there or in its tensorboard/")


@contextlib.contextmanager
def tensorboard(logdir: Path, timeout_s: float) -> Iterator[str]:
    """A real TensorBoard server on ``logdir``; yields its base URL once the custom-scalars
    layout is served (bounded wait), and stops it afterwards."""
    port = _free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
        + ["--port", str(port), "--host", "127.0.0.1", "--load_fast", "false"],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"tensorboard exited: {log.read().decode()[-2000:]}")
            with contextlib.suppress(OSError, ValueError):
                url = f"{base}/data/plugin/custom_scalars/layout"
                with urllib.request.urlopen(url, timeout=5) as r:
                    if json.loads(r.read()):  # {} until the layout is loaded
                        break
            if time.monotonic() > deadline:
                raise SystemExit(f"tensorboard served no custom-scalars layout in {timeout_s}s")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def screenshot(
    browser: str, url: str, out: Path, *, width: int, height: int, wait_s: float
) -> None:
    """Load ``url`` in headless ``browser`` and save a ``width`` x ``height`` PNG to ``out``.

    ``wait_s`` of the page's virtual time pass first (its requests for the charts' data
    and their drawing); the browser's own run is bounded too."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tb-shot-") as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",  # as root in a container, the only way Chromium starts
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--virtual-time-budget={int(wait_s * 1000)}",
            f"--screenshot={out}",
            url,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=wait_s + 120)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(
            f"{browser} took no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
        )


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory or an event-file directory")
    parser.add_argument(
        "--out", type=Path, help="the PNG (default: RUN_DIR/report/tensorboard_custom_scalars.png)"
    )
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=3400)
    parser.add_argument("--wait-s", type=float, default=20.0, help="page time before the shot")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="for TensorBoard to load")
    parser.add_argument("--browser", help="the headless browser's executable")
    args = parser.parse_args(argv)
    if args.width < 200 or args.height < 200:
        parser.error("--width and --height must be at least 200 pixels")
    logdir = event_dir(args.run_dir)
    browser = find_browser(args.browser)
    out = args.out or args.run_dir / "report" / "tensorboard_custom_scalars.png"
    with tensorboard(logdir, args.timeout_s) as base:
        screenshot(
            browser,
            f"{base}/#custom_scalars",
            out,
            width=args.width,
            height=args.height,
            wait_s=args.wait_s,
        )
    print(out)
    return out


if __name__ == "__main__":
    main()
