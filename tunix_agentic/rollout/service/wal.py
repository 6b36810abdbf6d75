"""The rollout node's write-ahead log: what it accepted and how each group ended.

One JSON object per line in ``STATE_DIR/groups.wal``, appended only:

* ``{"kind": "accepted", "group_id", "body"}`` when a group is accepted (flushed);
* ``{"kind": "final", "group_id", "status", "cursor", "answer"}`` when it ends, written
  and ``fsync``-ed *before* anyone is told it ended (``answer`` is what ``GET
  /v1/groups/{id}`` returns; ``cursor`` its place in completion order).

:meth:`GroupLog.open` replays the log: finished groups come back as they were, and
groups accepted but never finished are returned apart (the node reports them ``lost``).
A torn last line (the process was killed mid-write) is cut off; a bad line anywhere
else is an error naming it, never silently skipped. Writes run on a worker thread, in
order, so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["FinalRecord", "GroupLog", "Replay"]

LOG_NAME = "groups.wal"


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

    def open(self) -> Replay:
        """Replay the log (cutting a torn last line off) and open it for appending."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        replay = Replay({}, [], [])
        data = self.path.read_bytes() if self.path.exists() else b""
        good = 0  # bytes up to the end of the last whole, valid line
        lines = data.split(b"\n")
        for number, line in enumerate(lines, 1):
            is_last = number == len(lines)
            if is_last and not line:
                break
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
                if is_last:  # no newline after it: the write may be incomplete
                    raise ValueError("no newline at the end")
                self._apply(replay, record, good)
            except (ValueError, KeyError, TypeError) as exc:
                if is_last or (number == len(lines) - 1 and not lines[-1]):
                    replay.torn_bytes = len(data) - good
                    break
                raise ValueError(
                    f"{self.path}: line {number} is not a valid record: {exc}"
                ) from None
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
            if gid in replay.unfinished:
                replay.unfinished.remove(gid)
            replay.unfinished.append(gid)
        elif kind == "final":
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

    async def accepted(self, group_id: str, body: dict[str, Any]) -> None:
        """Record that ``group_id`` was accepted with ``body`` (flushed, not fsync-ed: a
        killed process loses nothing written; a lost acceptance only turns ``lost`` into
        unknown, and the client resubmits either way)."""
        record = {"kind": "accepted", "group_id": group_id, "body": body}
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


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
