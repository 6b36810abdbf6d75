"""The rollout node's operator scope: who may change its engines and policy, or cancel groups.

A node has two kinds of credential. The API key (``--api-key``, ``$TUNIX_AGENTIC_API_KEY``)
is what agents and the trainer send on every route. The admin key is the operator's: the
routes that change what the node trusts (``POST`` / ``DELETE /v1/engines``, ``POST
/v1/policy``) or destroy other clients' work (``DELETE /v1/groups/{id}``) need it, and no
API key opens them. Given as ``--admin-key`` or ``$TUNIX_AGENTIC_ADMIN_KEY``.

Without one, the node makes a random admin token when it starts listening and writes it,
readable by its own user only (0600 in a 0700 directory), to :func:`token_path` of its
port; it removes the file when it stops. A trainer on the same machine and user
(:class:`~tunix_agentic.rollout.client.node_client.NodeClient`) reads it there for a
loopback node URL, so the node's own trainer needs no configuration, while other users,
sandboxed agent code (which sees neither this user's home nor its runtime directory) and
anything beyond this machine cannot. Host-side only: nothing here imports JAX.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

from tunix_agentic.serving.http import is_loopback

ADMIN_KEY_ENV = "TUNIX_AGENTIC_ADMIN_KEY"
# Where node tokens live (tests point it at a temporary directory).
RUNTIME_DIR_ENV = "TUNIX_AGENTIC_RUNTIME_DIR"


def runtime_dir() -> Path:
    """``$TUNIX_AGENTIC_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/tunix-agentic``, else
    ``~/.cache/tunix-agentic/run``."""
    given = os.environ.get(RUNTIME_DIR_ENV)
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "tunix-agentic"
    return Path.home() / ".cache" / "tunix-agentic" / "run"


def token_path(port: int) -> Path:
    """Where the node listening on ``port`` of this machine keeps its admin token."""
    return runtime_dir() / f"rollout-node-{int(port)}.admin"


def write_token(port: int, token: str) -> Path:
    """Leave ``token``, the admin token of the node on ``port``, for this user only; its
    path. OSError if the directory is another user's or open to others."""
    folder = runtime_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise OSError(f"{folder} must be this user's and closed to others (chmod 700 {folder})")
    path = token_path(port)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return path


def remove_token(path: Path, token: str) -> None:
    """Remove ``path`` if it still holds ``token`` (a later node on the port owns it else)."""
    try:
        if path.read_text().strip() == token:
            path.unlink()
    except OSError:
        pass


def local_token(url: str) -> str | None:
    """The admin token a node at ``url`` wrote on this machine (loopback URLs only), or
    None when there is none to read."""
    parts = urlsplit(url)
    if parts.hostname is None or not is_loopback(parts.hostname) or parts.port is None:
        return None
    try:
        return token_path(parts.port).read_text().strip() or None
    except OSError:
        return None


def admin_key_for(url: str, given: str | None = None) -> str | None:
    """The admin credential to send to the node at ``url``: ``given``, else
    ``$TUNIX_AGENTIC_ADMIN_KEY``, else the node's local token file."""
    return given or os.environ.get(ADMIN_KEY_ENV) or local_token(url)
