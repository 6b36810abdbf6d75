"""The rollout node's write-ahead log: what it accepted and how each group ended.

One JSON object per line in ``STATE_DIR/groups.wal``, appended only:

* ``{"kind": "accepted", "group_id", "body", "owner"}`` when a group is accepted (flushed;
  ``owner``: who may read it, see :data:`OPERATOR`; a line without one is the operator's);
* ``{"kind": "final", "group_id", "status", "cursor", "answer"}`` when it ends, written
  and ``fsync``-ed *before* anyone is told it ended (``answer`` is what ``GET
  /v1/groups/{id}`` returns; ``cursor`` its place in completion order).

:meth:`GroupLog.open` replays the log: finished groups come back as they were, and
groups accepted but never finished are returned apart (the node reports them ``lost``).
A torn last line (no newline after it: the process was killed mid-write) is cut off; a
bad line that ends in a newline, the last one included, was written whole and then
damaged: :class:`LogDamaged` names it and the repair (:func:`repair_log`, ``serve-rollout
--repair-log``), never silently skipped. Writes run on a worker thread, in order, so the
event loop never waits on the disk.

One node at a time: :meth:`GroupLog.open` takes an exclusive ``flock`` on
``STATE_DIR/node.lock`` (holding the owner's pid) for as long as the log is open; a second
node on the directory gets :class:`StateDirBusy`. The lock is the kernel's: it goes with
the process, so a killed node leaves nothing to clean up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "FinalRecord",
    "GroupLog",
    "LogDamaged",
    "Repair",
    "Replay",
    "StateDirBusy",
    "repair_log",
]

LOG_NAME = "groups.wal"
# The owner of a group the operator (the admin key: the run's trainer) submitted; any other
# owner is a client's identity (serving.http.client_identity), and only it and the operator
# may read the group.
OPERATOR = "operator"
LOCK_NAME = "node.lock"


class StateDirBusy(RuntimeError):
    """Another live process holds the state dir (its lock names the pid)."""


class LogDamaged(ValueError):
    """A whole line of the log is not a valid record: ``path``, ``line`` (1-based)."""

    def __init__(self, path: Path, line: int, why: str):
        super().__init__(
            f"{path}: line {line} is not a valid record ({why}); the line ends in a newline, "
            "so it was written whole and damaged since, not torn by a kill. Look at the file, "
            "then repair it with `tunix-agentic serve-rollout --repair-log ...` (same "
            "--state-dir), which drops the bad lines and prints what it drops"
        )
        self.path, self.line = path, line


@dataclasses.dataclass(frozen=True)
class FinalRecord:
    """How one group ended: its status, its place in completion order, its answer, and
    where its line starts in the log (``offset``: -1 until written)."""

    group_id: str
    status: str
    cursor: int
    answer: dict[str, Any]
    offset: int = -1


@dataclasses.dataclass
class Replay:
    """What a log held: the request body of every group accepted, finished groups in
    completion order, and the ids accepted but never finished (oldest first)."""

    bodies: dict[str, dict[str, Any]]
    finals: list[FinalRecord]
    unfinished: list[str]
    torn_bytes: int = 0  # cut off the end of the log (a write the kill interrupted)
    owners: dict[str, str] = dataclasses.field(default_factory=dict)  # group id -> submitter

    @property
    def next_cursor(self) -> int:
        return self.finals[-1].cursor + 1 if self.finals else 1


class GroupLog:
    """An append-only log under ``state_dir`` (created if missing). Use :meth:`open`."""

    def __init__(self, state_dir: str | Path):
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / LOG_NAME
        self._file = None
        self._size = 0  # bytes in the log: where the next line starts
        self._lock = asyncio.Lock()
        self._lock_fd: int | None = None  # the state dir's flock, held while open

    def open(self) -> Replay:
        """Lock the state dir, replay the log (cutting a torn last line off) and open it for
        appending. StateDirBusy when another process holds the dir; LogDamaged naming the
        first bad line (the log is left as it was, the lock released)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_state_dir(self.state_dir)
        try:
            return self._replay()
        except BaseException:
            self.close()
            raise

    def _replay(self) -> Replay:
        replay = Replay({}, [], [])
        data = self.path.read_bytes() if self.path.exists() else b""
        good = 0  # bytes up to the end of the last whole, valid line
        lines = data.split(b"\n")
        for number, line in enumerate(lines, 1):
            if number == len(lines):  # no newline after it: the write may be incomplete
                replay.torn_bytes = len(line)
                break
            try:
                self._apply(replay, _record(line), good)
            except (ValueError, KeyError, TypeError) as exc:
                raise LogDamaged(self.path, number, _why(exc)) from None
            good += len(line) + 1
        if replay.torn_bytes:
            with open(self.path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        self._file = open(self.path, "ab")
        self._size = good
        return replay

    @staticmethod
    def _apply(replay: Replay, record: dict[str, Any], offset: int) -> None:
        # A group resubmitted after it was lost is accepted again: it is unfinished while
        # its newest acceptance has no final record after it.
        kind, gid = record["kind"], str(record["group_id"])
        if kind == "accepted":
            replay.bodies[gid] = dict(record["body"])
            replay.owners[gid] = str(record.get("owner", OPERATOR))
            if gid in replay.unfinished:
                replay.unfinished.remove(gid)
            replay.unfinished.append(gid)
        elif kind == "final":
            if gid not in replay.bodies:
                raise ValueError(f"a final record for group {gid!r}, which no line before accepted")
            replay.finals.append(
                FinalRecord(
                    gid,
                    str(record["status"]),
                    int(record["cursor"]),
                    dict(record["answer"]),
                    offset,
                )
            )
            if gid in replay.unfinished:
                replay.unfinished.remove(gid)
        else:
            raise ValueError(f"unknown kind {kind!r}")

    async def accepted(self, group_id: str, body: dict[str, Any], owner: str = OPERATOR) -> None:
        """Record that ``group_id`` was accepted with ``body`` from ``owner`` (flushed, not
        fsync-ed: a killed process loses nothing written; a lost acceptance only turns
        ``lost`` into unknown, and the client resubmits either way)."""
        record = {"kind": "accepted", "group_id": group_id, "body": body, "owner": owner}
        await self._append((_dumps(record) + "\n").encode(), sync=False)

    async def finished(self, record: FinalRecord, answer_text: str | None = None) -> int:
        """Record how a group ended; returns once the line is on disk (fsync), with the
        offset :meth:`read_answer` reads it back from. ``answer_text``: ``record.answer``
        already encoded as JSON (the node encodes a group once, for the log and its
        answers alike)."""
        if answer_text is None:
            answer_text = _dumps(record.answer)
        head = _dumps(
            {
                "kind": "final",
                "group_id": record.group_id,
                "status": record.status,
                "cursor": record.cursor,
            }
        )
        return await self._append(f'{head[:-1]},"answer":{answer_text}}}\n'.encode(), sync=True)

    def read_answer(self, offset: int) -> dict[str, Any]:
        """The answer of the final record at ``offset`` (blocking: call it off the loop)."""
        with open(self.path, "rb") as f:
            f.seek(offset)
            record = json.loads(f.readline())
        if record.get("kind") != "final":
            raise ValueError(f"{self.path}: no final record at offset {offset}")
        return dict(record["answer"])

    async def _append(self, data: bytes, *, sync: bool) -> int:
        if self._file is None:
            raise RuntimeError("GroupLog.open() first (or the log was closed)")
        async with self._lock:  # one writer at a time: lines never interleave
            offset = self._size
            await asyncio.to_thread(self._write, data, sync)
            self._size += len(data)
            return offset

    def _write(self, data: bytes, sync: bool) -> None:
        self._file.write(data)
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


def lock_state_dir(state_dir: Path) -> int:
    """An exclusive ``flock`` on ``state_dir/node.lock``, our pid written in it; returns the
    open descriptor (closing it releases the lock). StateDirBusy naming the directory and
    the holder's pid when another open file holds it (another node, in this process too)."""
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateDirBusy(
            f"--state-dir {state_dir} is in use by another rollout node (pid {holder}, "
            f"holding {path}); give each node its own state dir, or stop that one first"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@dataclasses.dataclass(frozen=True)
class Repair:
    """What :func:`repair_log` dropped: ``(line number, the line's first 200 bytes)`` each,
    and the torn tail's size."""

    dropped: list[tuple[int, str]]
    torn_bytes: int


def repair_log(state_dir: str | Path) -> Repair:
    """Drop every line of ``state_dir``'s log that is not a valid record in its place (bad
    JSON, a final record for a group no line before accepted...) and a torn last line,
    keeping the rest in order; the state dir is locked meanwhile (StateDirBusy if a node
    holds it). The new log replaces the old one atomically; nothing changes when every
    line is good."""
    state_dir = Path(state_dir)
    path = state_dir / LOG_NAME
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = lock_state_dir(state_dir)
    try:
        data = path.read_bytes() if path.exists() else b""
        lines = data.split(b"\n")
        torn = len(lines[-1])
        replay, kept, dropped = Replay({}, [], []), [], []
        for number, line in enumerate(lines[:-1], 1):
            try:
                GroupLog._apply(replay, _record(line), 0)
            except (ValueError, KeyError, TypeError):
                dropped.append((number, line[:200].decode(errors="replace")))
                continue
            kept.append(line + b"\n")
        if dropped or torn:
            tmp = path.with_name(path.name + ".repair")
            with open(tmp, "wb") as f:
                f.write(b"".join(kept))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            dir_fd = os.open(state_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return Repair(dropped, torn)
    finally:
        os.close(fd)


def _record(line: bytes) -> dict[str, Any]:
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    return record


def _why(exc: Exception) -> str:
    return f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
