"""Tests for tunix_agentic.envs.sandbox: containment (files, network, fork bombs, memory,
time), no leaked processes or directories however the owner ends, the process fallback, and
the ``tunix-agentic sandbox`` command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest

import tunix_agentic.envs.sandbox.limits as sandbox_limits
from tunix_agentic.envs.sandbox import (
    SANDBOX_WORKDIR,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxIsolationWarning,
    SandboxLimitWarning,
    SandboxTotals,
    bwrap_problem,
    sweep_orphans,
)

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bwrap: {bwrap_problem()}")


def _marker() -> str:
    """A unique sleep duration: every process running it has the marker in its cmdline."""
    return f"{1000 + secrets.randbelow(10**6)}.{secrets.randbelow(10**6):06d}"


def _pids_with(marker: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(name))
    return pids


def _uid_pids(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def _wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
async def sandbox():
    async with Sandbox(SandboxConfig(timeout_s=10)) as sb:
        yield sb


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("cpu_s", 0),
        ("memory_mb", -1),
        ("max_procs", True),
        ("file_size_mb", 1.5),
        ("disk_mb", 0),
        ("total_memory_mb", 0),
        ("total_memory_mb", "1G"),
        ("timeout_s", 0),
        ("network", "no"),
        ("backend", "docker"),
        ("uid_base", 10),
        ("ro_paths", "/usr"),
        ("ro_paths", ("usr",)),
        ("ro_paths", ("/usr/../etc",)),
        ("ro_paths", ("/",)),
        ("ro_paths", ("/proc/self",)),
        ("ro_paths", (SANDBOX_WORKDIR + "/x",)),
    ],
    ids=lambda v: str(v),
)
def test_config_rejects_bad_fields_naming_them(field, value):
    with pytest.raises(ValueError, match=f"SandboxConfig.{field}"):
        SandboxConfig(**{field: value})


def test_config_defaults_show_this_python_and_normalise_lists():
    cfg = SandboxConfig(ro_paths=["/usr/", "/etc", "/usr"])
    assert cfg.ro_paths == ("/usr", "/etc")
    assert sys.prefix in SandboxConfig().ro_paths
    assert {"/usr", "/etc"} <= set(SandboxConfig().ro_paths)


# --- running commands -------------------------------------------------------------------------


@needs_bwrap
async def test_commands_run_in_the_private_workdir(sandbox):
    assert sandbox.backend == "bwrap" and sandbox.cwd == SANDBOX_WORKDIR
    assert sandbox.start_s is not None and sandbox.start_s > 0  # recorded for TensorBoard
    sandbox.write_file("task/input.txt", "forty-two\n")
    result = await sandbox.run("pwd; cat task/input.txt; echo out > made.txt; id -u")
    lines = result.output.splitlines()
    assert result.exit_code == 0 and not result.timed_out
    assert lines[:2] == [SANDBOX_WORKDIR, "forty-two"]
    assert sandbox.read_file("made.txt") == "out\n"
    assert (sandbox.workdir / "made.txt").is_file()
    if IS_ROOT:  # a uid of its own, never root
        assert int(lines[2]) == sandbox.uid and sandbox.uid != 0
    # /tmp is the sandbox's own and shared by its commands
    await sandbox.run("echo kept > /tmp/note")
    assert (await sandbox.run("cat /tmp/note")).output == "kept\n"
    assert (await sandbox.run("cat", input="fed")).output == "fed"
    assert (await sandbox.run(["sh", "-c", "exit 7"])).exit_code == 7


@needs_bwrap
async def test_sys_executable_runs_inside(sandbox):
    result = await sandbox.run([sandbox.python, "-c", "import sys; print(sys.prefix)"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == sys.prefix


@needs_bwrap
async def test_writing_outside_the_sandbox_fails(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("host data")
    hidden = tmp_path / "hidden.txt"
    hidden.write_text("secret")
    cfg = SandboxConfig(ro_paths=(*SandboxConfig().ro_paths, str(shared)))
    async with Sandbox(cfg) as sb:
        read = await sb.run(f"cat {shared}/data.txt")
        assert read.exit_code == 0 and read.output == "host data"
        for target in (f"{shared}/new.txt", f"{shared}/data.txt", "/etc/evil", "/usr/evil"):
            result = await sb.run(f"echo pwned > {target}")
            assert result.exit_code != 0, target
        assert (await sb.run(f"cat {hidden}")).exit_code != 0  # not visible at all
    assert (shared / "data.txt").read_text() == "host data"
    assert sorted(p.name for p in shared.iterdir()) == ["data.txt"]
    assert not Path("/etc/evil").exists() and not Path("/usr/evil").exists()


@needs_bwrap
async def test_network_is_cut_off_unless_enabled():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    probe = (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
        "print('connected')\n"
    )
    try:
        async with Sandbox() as sb:
            cut = await sb.run([sb.python, "-c", probe])
        async with Sandbox(SandboxConfig(network=True)) as sb:
            open_ = await sb.run([sb.python, "-c", probe])
    finally:
        server.close()
    assert cut.exit_code != 0 and "connected" not in cut.output
    assert "Connection refused" in cut.output or "unreachable" in cut.output
    assert open_.exit_code == 0 and open_.output.strip() == "connected"  # the probe can succeed


async def _until(predicate, timeout: float = 10.0) -> bool:
    """Waits (without blocking the loop) until ``predicate()``; False when ``timeout`` ran out."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.05)
    return predicate()


@needs_bwrap
@pytest.mark.skipif(not IS_ROOT, reason="per-sandbox uids (a contained fork bomb) need root")
async def test_fork_bomb_is_contained_and_spares_other_episodes():
    bomb = "b() { b | b & }; b 2>/tmp/bomb.err; sleep 100"
    async with Sandbox(SandboxConfig(timeout_s=60, max_procs=32)) as a, Sandbox() as b:
        assert a.uid != b.uid
        bombing = asyncio.ensure_future(a.run(bomb))
        errors = a.workdir.parent / "tmp" / "bomb.err"  # the sandbox's /tmp, from the host
        counts: list[int] = []

        def refused() -> bool:
            counts.append(len(_uid_pids(a.uid)))
            return errors.exists() and "fork" in errors.read_text().lower()

        assert await _until(refused, 30)  # the bomb ran into its limit (the wait is bounded)
        other = await b.run("echo still fine")  # another episode runs while the bomb does
        host = subprocess.run(["sh", "-c", "echo host fine"], capture_output=True, timeout=30)
        counts.append(len(_uid_pids(a.uid)))
        assert not bombing.done()
        await a.close()  # ends the bomb
        result = await asyncio.wait_for(bombing, 30)
        gone = await _until(lambda: _uid_pids(a.uid) == [])  # its PID namespace is torn down
    assert 0 < max(counts) <= 32 + 2  # never more than its budget
    assert other.exit_code == 0 and other.output == "still fine\n" and not other.timed_out
    assert host.stdout == b"host fine\n"
    assert result.exit_code != 0
    assert gone, _uid_pids(a.uid)


@needs_bwrap
async def test_a_huge_allocation_fails_inside(sandbox):
    result = await sandbox.run([sandbox.python, "-c", "x = bytearray(20 * 2**30)"])
    assert result.exit_code != 0 and "MemoryError" in result.output
    assert (await sandbox.run("echo alive")).output == "alive\n"
    assert subprocess.run(["true"]).returncode == 0


@needs_bwrap
async def test_an_infinite_loop_is_cut_by_the_timeout(sandbox):
    marker = _marker()
    run = sandbox.run(f"sleep {marker} & while :; do :; done", timeout=1.0)
    result = await asyncio.wait_for(run, 60)  # a bound against a hang only
    assert result.timed_out and result.exit_code == -signal.SIGKILL
    assert _pids_with(marker) == []  # the whole tree, background job included


@needs_bwrap
async def test_background_leftovers_die_with_their_command(sandbox):
    marker = _marker()
    # The sleep holds the output pipe for 1000+ s: run() must return when the command
    # exits, not when the pipe closes (it would hit the fixture's 10 s timeout instead).
    result = await asyncio.wait_for(sandbox.run(f"sleep {marker} & echo started"), 60)
    assert result.exit_code == 0 and result.output == "started\n" and not result.timed_out
    assert _wait_until(lambda: _pids_with(marker) == [], 10)


@needs_bwrap
async def test_output_is_bounded_with_a_marker(sandbox):
    result = await sandbox.run("yes | head -c 3000000", max_output=1000)
    assert len(result.output) < 1200
    assert "characters truncated ...]" in result.output
    assert result.output.startswith("y\ny\n") and result.output.endswith("y\n")


# --- totals per sandbox -------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.skipif(not IS_ROOT, reason="a size-capped tmpfs needs root (else per file only)")
async def test_workspace_and_tmp_together_hold_at_most_disk_mb():
    async with Sandbox(SandboxConfig(disk_mb=32, file_size_mb=24, timeout_s=30)) as sb:
        assert sb.totals.disk == "tmpfs"
        fill = "head -c 20M /dev/zero > /tmp/a; head -c 20M /dev/zero > b; echo rc=$?"
        full = await sb.run(fill)
        dirs = (sb.workdir, sb.workdir.parent / "tmp")
        # Regular files only: a read-only path under /tmp (CI's venv) is a directory there.
        held = sum(p.lstat().st_size for d in dirs for p in d.iterdir() if p.is_file())
        fs = os.statvfs(sb.workdir)
        again = await sb.run("rm /tmp/a && head -c 20M /dev/zero > c && echo fits")
    assert "No space left on device" in full.output and "rc=1" in full.output
    assert 20 << 20 <= held <= 32 << 20  # the host holds no more than the cap
    assert fs.f_blocks * fs.f_frsize == 32 << 20
    assert again.output == "fits\n"  # freeing space frees it


CHILD = "import time; b = b'x' * (60 << 20); print('held', flush=True); time.sleep(1)"
PARENT = f"""
import subprocess, sys
kids = [subprocess.Popen([sys.executable, '-c', {CHILD!r}]) for _ in range(4)]
print('codes', *[k.wait() for k in kids])
"""


def _peak_bytes(cgroup: str) -> int | None:
    for name in ("memory.max_usage_in_bytes", "memory.peak"):  # v1, v2
        path = Path(cgroup) / name
        if path.exists():
            return int(path.read_text())
    return None


@needs_bwrap
async def test_children_together_cannot_exceed_total_memory_mb():
    # Each child may hold 60 MB (memory_mb bounds one process), four together may not.
    async with Sandbox(SandboxConfig(memory_mb=512, total_memory_mb=160, timeout_s=60)) as sb:
        if sb.totals.memory == "per-process":
            pytest.skip("no writable memory cgroup here (the fallback warns)")
        result = await sb.run([sb.python, "-c", PARENT])
        peaks = [_peak_bytes(d) for d in sb.totals.cgroups]
        alive = await sb.run("echo alive")
    codes = [int(c) for c in result.output.split("codes", 1)[1].split()]
    assert len(codes) == 4 and any(c != 0 for c in codes), result.output  # one was stopped
    assert any(p is not None for p in peaks)
    assert all(p is None or p <= 160 << 20 for p in peaks)  # the sum held never passed it
    assert alive.output == "alive\n"


@pytest.mark.parametrize("backend", ["bwrap", "process"], ids=["bwrap", "process"])
async def test_every_process_of_a_sandbox_runs_in_its_cgroups(backend):
    if backend == "bwrap" and bwrap_problem() is not None:
        pytest.skip(f"bwrap: {bwrap_problem()}")
    marker = _marker()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxIsolationWarning)
        sb = await Sandbox.create(SandboxConfig(backend=backend, max_procs=24, timeout_s=60))
    try:
        if not sb.totals.cgroups:
            pytest.skip("no writable cgroup hierarchy here (the fallback warns)")
        assert sb.totals.processes.startswith("cgroup")
        running = asyncio.ensure_future(sb.run(f"sleep {marker} & sleep {marker}"))
        await sb.spawn(["sleep", marker])
        sb.spawn_pty(["sleep", marker])
        assert await _until(lambda: len(_pids_with(marker)) >= 4), _pids_with(marker)
        for cgroup in sb.totals.cgroups:

            def joined(cgroup: str = cgroup) -> bool:  # a launch joins before its bwrap runs
                members = (Path(cgroup) / "cgroup.procs").read_text().split()
                return set(_pids_with(marker)) <= {int(p) for p in members}

            assert await _until(joined), cgroup
            if (Path(cgroup) / "pids.max").exists():
                assert (Path(cgroup) / "pids.max").read_text().strip() == str(
                    24 + sandbox_limits.PIDS_SLACK
                )
    finally:
        await sb.close()
    await running
    assert not any(os.path.exists(c) for c in sb.totals.cgroups)  # removed at close


def test_a_total_that_cannot_be_enforced_warns_once(monkeypatch):
    monkeypatch.setattr(sandbox_limits, "_WARNED", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sandbox_limits.warn_unbounded(SandboxTotals("tmpfs", "cgroup-v1", "cgroup-v1"))
        assert caught == []
        for _ in range(3):
            sandbox_limits.warn_unbounded(SandboxTotals("per-file", "per-process", "per-user"))
    assert [w.category for w in caught] == [SandboxLimitWarning]
    assert "file_size_mb" in str(caught[0].message) and "memory_mb" in str(caught[0].message)


MOUNTINFO_V1 = (
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "37 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
MOUNTINFO_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNTINFO_NS = "40 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"


@pytest.mark.parametrize(
    "mountinfo, cgroup, expected",
    [
        (
            MOUNTINFO_V1,
            "8:pids:/\n4:memory:/a/b\n0::/\n",
            [
                (1, ("memory",), "/sys/fs/cgroup/memory", "a/b"),
                (1, ("pids",), "/sys/fs/cgroup/pids", ""),
            ],
        ),
        (
            MOUNTINFO_V2,
            "0::/system.slice/trainer.service\n",
            [(2, ("memory", "pids"), "/sys/fs/cgroup", "system.slice/trainer.service")],
        ),
        (
            MOUNTINFO_NS,
            "4:memory:/docker/abc/x\n",
            [(1, ("memory",), "/sys/fs/cgroup/memory", "x")],
        ),
        (MOUNTINFO_NS, "4:memory:/elsewhere\n", []),
    ],
    ids=["v1-hybrid", "v2", "v1-mounted-below-root", "v1-own-cgroup-not-mounted"],
)
def test_cgroup_hierarchies_are_found_from_mountinfo(mountinfo, cgroup, expected):
    plan = sandbox_limits._plan(mountinfo, cgroup)
    assert [(c.version, c.controllers, str(c.mount), c.own) for c in plan] == expected


@needs_bwrap
@pytest.mark.parametrize("depth", ["nested", "direct"], ids=["nested", "direct"])
async def test_a_link_planted_in_tmp_cannot_steer_the_read_only_binds(tmp_path, depth):
    # A read-only path under /tmp (CI's venv is /tmp/tunix-agentic-ci-venv) is bound inside
    # the sandbox's own /tmp, a host directory it writes. The agent swaps the path's top
    # directory there for a link to a host directory (bwrap sees the host's / at /oldroot
    # while it sets up): the next start must make nothing there, and still work.
    outer = Path(tempfile.mkdtemp(prefix="tunix-ro-", dir="/tmp"))
    outer.chmod(0o755)
    try:
        ro = outer / "venv" if depth == "nested" else outer
        ro.mkdir(exist_ok=True)
        (ro / "marker").write_text("ro data")
        target = tmp_path / "target"
        target.mkdir()
        cfg = SandboxConfig(ro_paths=(*SandboxConfig().ro_paths, str(ro)), timeout_s=30)
        async with Sandbox(cfg) as sb:
            first = await sb.run(f"cat {ro}/marker")
            await sb.run(f"mv {outer} /tmp/moved; rm -rf {outer}; ln -s /oldroot{target} {outer}")
            after = await sb.run(f"cat {ro}/marker")
        assert first.output == "ro data"
        assert list(target.iterdir()) == []  # root made nothing at the link's target
        assert after.exit_code == 0 and after.output == "ro data", after.output
    finally:
        shutil.rmtree(outer)


# --- no leaks -----------------------------------------------------------------------------------


@needs_bwrap
async def test_close_kills_everything_and_removes_the_directory():
    marker = _marker()
    sb = await Sandbox.create(SandboxConfig(timeout_s=60))
    running = asyncio.ensure_future(sb.run(f"sleep {marker}"))
    pty = sb.spawn_pty(["sh", "-c", f"sleep {marker}"])
    proc = await sb.spawn(["sleep", marker])
    assert _wait_until(lambda: len(_pids_with(marker)) >= 3, 5)
    top = sb.workdir.parent
    await sb.close()
    await sb.close()  # idempotent
    result = await running
    assert result.exit_code != 0
    assert _pids_with(marker) == [] and not top.exists()
    assert pty.closed and proc.returncode is not None
    with pytest.raises(SandboxError, match="closed"):
        await sb.run("true")


@needs_bwrap
async def test_an_exception_inside_async_with_leaves_nothing():
    marker = _marker()
    with pytest.raises(RuntimeError, match="agent crashed"):
        async with Sandbox() as sb:
            top = sb.workdir.parent
            asyncio.ensure_future(sb.run(f"sleep {marker}"))
            await sb.spawn(["sleep", marker])
            assert _wait_until(lambda: len(_pids_with(marker)) >= 2, 5)
            raise RuntimeError("agent crashed")
    assert _pids_with(marker) == [] and not top.exists()


async def test_a_start_cancelled_while_the_directory_is_made_leaves_nothing(monkeypatch):
    """Ctrl-C during an episode's INIT cancels ``start`` while its worker thread is still
    taking the directory: the thread finishes, then releases it (CI once found one left)."""
    import tunix_agentic.envs.sandbox.resources as resources

    taken, go_on = threading.Event(), threading.Event()
    real = resources._allocate

    def slow_allocate(res, config, backend):
        out = real(res, config, backend)
        taken.set()
        go_on.wait(30)
        return out

    monkeypatch.setattr(resources, "_allocate", slow_allocate)
    sb = Sandbox(SandboxConfig(backend="process"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxIsolationWarning)
        task = asyncio.ensure_future(sb.start())
        assert await asyncio.to_thread(taken.wait, 30)
        made = sb._res.dir
        assert made is not None and made.is_dir()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert sb.closed and made.is_dir()  # the thread still holds it...
    go_on.set()
    assert await _until(lambda: not made.exists())  # ...and removes it when done
    with pytest.raises(SandboxError, match="closed"):
        await sb.start()


PARENT_SCRIPT = """
import asyncio, sys
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig
from tunix_agentic.envs.tools import BashTool, PythonTool

MARK = sys.argv[1]

async def main():
    async with Sandbox(SandboxConfig(timeout_s=600)) as sb:
        bash, py = BashTool(sb, timeout=600), PythonTool(sb, timeout=600)
        await bash.run("true")
        await py.run("1")
        jobs = [
            bash.run(f"sleep {MARK}"),
            py.run(f"import subprocess; subprocess.run(['sleep', '{MARK}'])"),
            sb.run(f"sleep {MARK} & sleep {MARK}"),
        ]
        print("DIR", sb.workdir.parent, *sb.totals.cgroups, flush=True)
        await asyncio.gather(*jobs)

asyncio.run(main())
"""


def _start_parent(tmp_path: Path, marker: str) -> tuple[subprocess.Popen, Path, list[Path]]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), marker],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("DIR "), (line, proc.stderr.read() if proc.poll() is not None else "")
    top, *cgroups = [Path(p) for p in line.split()[1:]]
    # Wait until the sandboxed commands really run (bash's, python's child, run()'s two).
    assert _wait_until(lambda: len(_pids_with(marker)) >= 4, 15), _pids_with(marker)
    return proc, top, cgroups


@needs_bwrap
def test_ctrl_c_of_the_parent_cleans_up(tmp_path):
    marker = _marker()
    proc, top, cgroups = _start_parent(tmp_path, marker)
    assert top.is_dir()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)
    assert proc.returncode != 0  # KeyboardInterrupt
    assert _wait_until(lambda: _pids_with(marker) == [], 5), _pids_with(marker)
    assert not top.exists()  # removed by the parent itself on the way out
    assert not [c for c in cgroups if c.exists()]


@needs_bwrap
def test_sigkill_of_the_parent_leaves_nothing_after_a_sweep(tmp_path):
    marker = _marker()
    proc, top, cgroups = _start_parent(tmp_path, marker)
    proc.kill()
    proc.wait(timeout=10)
    # --die-with-parent: the kernel kills every sandbox of the dead parent.
    assert _wait_until(lambda: _pids_with(marker) == [], 10), _pids_with(marker)
    assert top.is_dir()  # a killed process cannot remove its directory...
    assert os.path.ismount(top) == IS_ROOT  # ...nor unmount its tmpfs...
    assert all(c.is_dir() for c in cgroups)  # ...nor remove its cgroups
    swept = sweep_orphans()
    assert top in swept and not top.exists()  # the next sweep does all three
    assert not [c for c in cgroups if c.exists()]
    assert top not in sweep_orphans()


def test_sweep_keeps_live_owners_directories(tmp_path):
    live = tmp_path / f"{os.getpid()}.{_start_time_self()}-abc123"
    dead_pid = _dead_pid()
    dead = tmp_path / f"{dead_pid}.12345-def456"
    reused = tmp_path / f"{os.getpid()}.1-0a0a0a"  # our pid, another start time: a dead owner
    for d in (live, dead, reused):
        (d / "work").mkdir(parents=True)
    swept = sweep_orphans(tmp_path)
    assert sorted(swept) == sorted([dead, reused])
    assert live.is_dir() and not dead.exists() and not reused.exists()


def _start_time_self() -> int:
    data = Path(f"/proc/{os.getpid()}/stat").read_bytes()
    return int(data[data.rindex(b")") + 2 :].split()[19])


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- the process fallback ---------------------------------------------------------------------


async def test_process_backend_applies_limits_and_warns():
    cfg = SandboxConfig(backend="process", memory_mb=512, max_procs=40, cpu_s=7)
    with pytest.warns(SandboxIsolationWarning, match="NO network or filesystem isolation"):
        sb = await Sandbox.create(cfg)
    try:
        assert sb.backend == "process" and sb.cwd == str(sb.workdir)
        result = await sb.run(["bash", "-c", "ulimit -v; ulimit -t; ulimit -u; pwd; id -u"])
        lines = result.output.split()
        assert result.exit_code == 0, result.output
        assert lines[:2] == [str(512 * 1024), "7"]
        assert lines[3] == str(sb.workdir)
        if IS_ROOT:
            assert lines[2] == "40" and int(lines[4]) == sb.uid != 0
            assert (await sb.run("echo x > /etc/evil")).exit_code != 0  # not root any more
        alloc = await sb.run([sb.python, "-c", "x = bytearray(2 * 2**30)"])
        assert alloc.exit_code != 0 and "MemoryError" in alloc.output
        marker = _marker()
        slow = await sb.run(f"sleep {marker}", timeout=0.5)
        assert slow.timed_out and _pids_with(marker) == []
        top = sb.workdir.parent
    finally:
        await sb.close()
    assert not top.exists()


@pytest.mark.skipif(not IS_ROOT, reason="hides bwrap from a child through a privileged bwrap")
@needs_bwrap
def test_without_bwrap_auto_falls_back_and_bwrap_is_refused(tmp_path):
    child = (
        "import asyncio, warnings\n"
        "from tunix_agentic.envs.sandbox import (\n"
        "    Sandbox, SandboxConfig, SandboxError, SandboxIsolationWarning)\n"
        "async def main():\n"
        "    try:\n"
        "        await Sandbox.create(SandboxConfig(backend='bwrap'))\n"
        "    except SandboxError as exc:\n"
        "        print('REFUSED', exc)\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('default')\n"
        "        for _ in range(3):\n"
        "            async with Sandbox() as sb:\n"
        "                r = await sb.run('ulimit -v')\n"
        "    isolation = [w for w in caught if w.category is SandboxIsolationWarning]\n"
        "    print('BACKEND', sb.backend, r.output.strip(), len(isolation))\n"
        "asyncio.run(main())\n"
    )
    # A child that sees /dev/null where bwrap was: the binary is not executable there.
    argv = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", "/dev/null", "/usr/bin/bwrap"]
    done = subprocess.run(
        [*argv, "--", sys.executable, "-c", child],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("REFUSED") and "bwrap" in lines[0]
    assert lines[1] == f"BACKEND process {2048 * 1024} 1"  # one warning for three sandboxes


# --- files --------------------------------------------------------------------------------------


@needs_bwrap
async def test_host_side_file_helpers_stay_inside(sandbox):
    await sandbox.run("ln -s /etc/passwd out; ln -s ../../.. up; mkdir d; ln -s /workspace/d in")
    sandbox.write_file("in/x.txt", "via link")
    assert sandbox.read_file("d/x.txt") == "via link"
    for bad in ("out", "up/etc/passwd", "../x", "/etc/passwd"):
        with pytest.raises(ValueError):
            sandbox.read_file(bad)
    with pytest.raises(ValueError):
        sandbox.write_file("out", "pwned")
    assert "pwned" not in Path("/etc/passwd").read_text()


# --- the CLI --------------------------------------------------------------------------------------


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunix_agentic.cli.main", "sandbox", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_runs_a_command_and_returns_its_exit_code():
    done = _cli("--", "sh", "-c", "echo hi; exit 3")
    assert done.stdout == "hi\n" and done.returncode == 3, done.stderr


def test_cli_reads_the_env_sandbox_section(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  name: arithmetic\n  sandbox:\n    timeout_s: 0.5\n")
    done = _cli("--config", str(config), "--", "sleep", "5")
    assert done.returncode == 124 and "timed out" in done.stderr
    config.write_text("env:\n  sandbox:\n    memory_mb: 0\n")
    bad = _cli("--config", str(config), "--", "true")
    assert bad.returncode == 2 and "memory_mb" in bad.stderr


@pytest.mark.skipif(not IS_ROOT, reason="a size-capped tmpfs needs root (else per file only)")
def test_cli_sandbox_caps_disk_use(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  sandbox:\n    disk_mb: 16\n")
    fill = "head -c 40M /dev/zero > /tmp/big || echo refused; wc -c < /tmp/big"
    done = _cli("--config", str(config), "--", "sh", "-c", fill)
    assert done.returncode == 0, done.stderr
    assert "No space left on device" in done.stderr
    refused, size = done.stdout.split()
    assert refused == "refused" and int(size) <= 16 << 20
