"""Tests for what sandboxed code may ask of the kernel and where sandboxes may run: the seccomp
filter (tunix_agentic.envs.sandbox.seccomp), failing closed without bwrap for model-written code,
and the sandbox uid range's check against the host's users (check_uid_range)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import tunix_agentic.envs.sandbox.launch as sandbox_launch
import tunix_agentic.envs.sandbox.seccomp as sandbox_seccomp
from tunix_agentic.cli.sandbox import main as sandbox_main
from tunix_agentic.envs.sandbox import (
    UID_SLOTS,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxIsolationWarning,
    bwrap_problem,
    check_uid_range,
)

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bwrap: {bwrap_problem()}")
needs_root = pytest.mark.skipif(not IS_ROOT, reason="sandbox uids are leased under root only")
BACKENDS = [pytest.param("bwrap", marks=needs_bwrap), "process"]
_CLI_DEFAULTS = {"config": None, "backend": None, "timeout": None}


async def _sandbox(backend: str) -> Sandbox:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxIsolationWarning)
        return await Sandbox.create(SandboxConfig(backend=backend, timeout_s=20))


# --- seccomp ------------------------------------------------------------------------------------

# Each refused call with arguments whose unfiltered outcome is harmless (and mostly not EPERM:
# EFAULT, EBADF, ESRCH, success), so that only the filter turns them into EPERM. "pid" is the
# probe's own pid. The probe prints {name: errno or "ok"} and its seccomp mode.
_PROBE = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, (nr, args) in json.loads(sys.argv[1]).items():
    args = [os.getpid() if a == "pid" else a for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a % 2**64) for a in args])
    if r == 0 and name.startswith("clone"):
        os._exit(0)  # an unfiltered clone made a child: it leaves at once
    out[name] = "ok" if r >= 0 else ctypes.get_errno()
status = open("/proc/self/status").read().splitlines()
out["Seccomp"] = next(line.split()[1] for line in status if line.startswith("Seccomp:"))
print(json.dumps(out))
"""
_SYSCALLS = {
    # key: (system call, arguments, errno under the filter)
    "unshare_newuser": ("unshare", [0x10000000], errno.EPERM),
    "unshare_newnet": ("unshare", [0x40000000], errno.EPERM),
    "unshare_newtime": ("unshare", [0x80], errno.EPERM),
    "clone_newuser": ("clone", [0x10000000 | 17, 0, 0, 0, 0], errno.EPERM),
    "clone3": ("clone3", [0, 0], errno.ENOSYS),
    "setns": ("setns", [-1, 0], errno.EPERM),
    "bpf": ("bpf", [0, 0, 0], errno.EPERM),
    "keyctl": ("keyctl", [0, -3, 0], errno.EPERM),  # the session keyring's id
    "add_key": ("add_key", [0, 0, 0, 0, -2], errno.EPERM),
    "request_key": ("request_key", [0, 0, 0, 0], errno.EPERM),
    "perf_event_open": ("perf_event_open", [0, 0, -1, -1, 0], errno.EPERM),
    "ptrace": ("ptrace", [0x7FFF, "pid", 0, 0], errno.EPERM),
    "process_vm_readv": ("process_vm_readv", ["pid", 0, 0, 0, 0, 0], errno.EPERM),
    "process_vm_writev": ("process_vm_writev", ["pid", 0, 0, 0, 0, 0], errno.EPERM),
    "mount": ("mount", [0, 0, 0, 0, 0], errno.EPERM),
    "umount2": ("umount2", [0, 0], errno.EPERM),
    "open_tree": ("open_tree", [-1, 0, 0], errno.EPERM),
    "fsopen": ("fsopen", [0, 0], errno.EPERM),
    "fsconfig": ("fsconfig", [-1, 0, 0, 0, 0], errno.EPERM),
    "move_mount": ("move_mount", [-1, 0, -1, 0, 0], errno.EPERM),
    "init_module": ("init_module", [0, 0, 0], errno.EPERM),
    "finit_module": ("finit_module", [-1, 0, 0], errno.EPERM),
    "kexec_load": ("kexec_load", [0, 0, 0, 0], errno.EPERM),
    "userfaultfd": ("userfaultfd", [1], errno.EPERM),  # UFFD_USER_MODE_ONLY: allowed unfiltered
    "io_uring_setup": ("io_uring_setup", [0, 0], errno.EPERM),
    "ioctl_tiocsti": ("ioctl", [0, (1 << 32) | 0x5412, 0], errno.EPERM),  # high bits ignored
}


@pytest.mark.parametrize("backend", BACKENDS, ids=["bwrap", "process"])
async def test_sandboxed_code_is_refused_kernel_surfaces(backend):
    import pyseccomp

    native = pyseccomp.Arch.NATIVE
    calls = {k: (pyseccomp.resolve_syscall(native, n), a) for k, (n, a, _) in _SYSCALLS.items()}
    sb = await _sandbox(backend)
    try:
        result = await sb.run([sb.python, "-c", _PROBE, json.dumps(calls)])
    finally:
        await sb.close()
    assert result.exit_code == 0, result.output
    seen = json.loads(result.output.strip().splitlines()[-1])
    assert seen.pop("Seccomp") == "2"  # a filter is loaded
    assert seen == {key: want for key, (_, _, want) in _SYSCALLS.items()}


_OTHER_ABI = {
    # i386's getpid through int 0x80, from an executable page.
    "i386": r"""
import ctypes, mmap
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes([0xB8, 0x14, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20; int 0x80; ret
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
""",
    # x32's unshare: x86_64's table with bit 30 set.
    "x32": "import ctypes; print(ctypes.CDLL(None).syscall(0x40000000 | 272, 0x10000000))",
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64's second and third ABIs")
@pytest.mark.parametrize("backend", BACKENDS, ids=["bwrap", "process"])
@pytest.mark.parametrize("abi", sorted(_OTHER_ABI), ids=sorted(_OTHER_ABI))
async def test_a_system_call_through_another_abi_kills_the_process(backend, abi):
    sb = await _sandbox(backend)
    try:
        result = await sb.run([sb.python, "-c", _OTHER_ABI[abi]])
    finally:
        await sb.close()
    # bwrap reports a command killed by signal N as 128 + N.
    assert result.exit_code in (-signal.SIGSYS, 128 + signal.SIGSYS), result


@pytest.mark.parametrize("backend", BACKENDS, ids=["bwrap", "process"])
@pytest.mark.parametrize(
    "command",
    ["unshare -Urn sh -c id", "unshare -U id", "unshare -r id", "unshare -Urm sh -c id"],
    ids=["user+net", "user", "map-root", "user+mount"],
)
async def test_no_user_namespace_can_be_made_inside(backend, command):
    sb = await _sandbox(backend)
    try:
        result = await sb.run(command)
    finally:
        await sb.close()
    assert result.exit_code != 0 and "uid=" not in result.output, result.output
    assert "Operation not permitted" in result.output


# socket(family, type, protocol) and socketpair through the raw system call (so that high
# bits reach the filter), each printed as "ok" or its errno.
_SOCKETS = r"""
import ctypes, json, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, (call, family, kind, proto) in json.loads(sys.argv[1]).items():
    nr = {"socket": 41, "socketpair": 53}[call] if sys.argv[2] == "x86_64" else None
    fds = (ctypes.c_int * 2)()
    ctypes.set_errno(0)
    if nr is not None:
        extra = [fds] if call == "socketpair" else []
        r = libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(family), kind, proto, *extra)
    elif call == "socket":
        r = libc.socket(ctypes.c_int(family % 2**32), kind, proto)
    else:
        r = libc.socketpair(family, kind, proto, fds)
    out[name] = "ok" if r >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""
_STREAM, _DGRAM, _RAW = 1, 2, 3
_SOCKET_CALLS = {
    # key: (call, family, type, protocol), refused by the filter or not
    "unix": (("socket", 1, _STREAM, 0), False),
    "inet": (("socket", 2, _STREAM, 0), False),
    "netlink-route": (("socket", 16, _RAW, 0), False),
    "unix-pair": (("socketpair", 1, _STREAM, 0), False),
    "vsock": (("socket", 40, _STREAM, 0), True),
    "packet": (("socket", 17, _RAW, 0), True),
    "netlink-uevent": (("socket", 16, _DGRAM, 15), True),
    "netlink-audit": (("socket", 16, _RAW, 9), True),
    "alg": (("socket", 38, 5, 0), True),  # AF_ALG, SOCK_SEQPACKET: allowed unfiltered
    "unspec": (("socket", 0, _STREAM, 0), True),
    "unix-high-bits": (("socket", (1 << 32) | 1, _STREAM, 0), True),
    "inet-pair": (("socketpair", 2, _STREAM, 0), True),
}


@pytest.mark.parametrize("backend", BACKENDS, ids=["bwrap", "process"])
async def test_only_allowed_socket_families_open(backend):
    calls = {k: call for k, (call, _) in _SOCKET_CALLS.items()}
    if os.uname().machine != "x86_64":
        del calls["unix-high-bits"]  # libc's socket() takes an int: no high bits to send
    sb = await _sandbox(backend)
    try:
        result = await sb.run([sb.python, "-c", _SOCKETS, json.dumps(calls), os.uname().machine])
    finally:
        await sb.close()
    assert result.exit_code == 0, result.output
    seen = json.loads(result.output.strip().splitlines()[-1])
    refused = {k for k, v in seen.items() if v in (errno.EPERM, errno.EACCES)}
    assert refused == {k for k in calls if _SOCKET_CALLS[k][1]}, seen
    assert all(seen[k] == "ok" for k in calls if not _SOCKET_CALLS[k][1]), seen


_WORK = r"""
import concurrent.futures, multiprocessing, os, subprocess, sys, threading
def square(x):
    return x * x
if __name__ == "__main__":
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        threads = sum(pool.map(square, range(10)))
    t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        forked = sum(pool.map(square, range(10)))
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    sub = subprocess.run([sys.executable, "-c", "import json, sqlite3; print(6 * 7)"],
                         capture_output=True, text=True).stdout.strip()
    print(threads, forked, os.waitstatus_to_exitcode(status), sub)
"""


@pytest.mark.parametrize("backend", BACKENDS, ids=["bwrap", "process"])
async def test_ordinary_work_still_runs_under_the_filter(backend):
    sb = await _sandbox(backend)
    try:
        sb.write_file("work.py", _WORK)
        py = await sb.run([sb.python, "work.py"])
        sh = await sb.run("seq 1 100 | sort -rn | head -1 & wait; (cd /tmp && echo sub) | cat")
    finally:
        await sb.close()
    assert py.exit_code == 0 and py.output.split()[-4:] == ["285", "285", "7", "42"], py.output
    assert sh.exit_code == 0 and sh.output.split() == ["100", "sub"], sh.output


@needs_bwrap
def test_cli_sandbox_refuses_a_user_namespace(capfd):
    # `tunix-agentic sandbox -- unshare -Urn sh -c id`, past the argument parser.
    code = sandbox_main(["--", "unshare", "-Urn", "sh", "-c", "id"], **_CLI_DEFAULTS)
    out, err = capfd.readouterr()
    assert code != 0 and "uid=" not in out, out
    assert "Operation not permitted" in err


def test_without_libseccomp_the_bwrap_backend_is_unavailable(monkeypatch):
    monkeypatch.setattr(sandbox_seccomp, "_STATE", {})  # as in a fresh process...
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # ...where it cannot be imported
    problem = sandbox_launch._probe_bwrap()
    assert problem is not None and "seccomp" in problem, problem
    assert "pip install pyseccomp" in problem and "apt-get install libseccomp2" in problem
    assert sandbox_seccomp.seccomp_loader(sandbox_launch._libc()) is None  # process: no filter


# --- no bwrap: model-written code does not run unisolated ---------------------------------------

_NO_BWRAP_CHILD = r"""
import asyncio, warnings
from tunix_agentic.envs.base import env_tasks
from tunix_agentic.envs.math_python import MathPythonEnv
from tunix_agentic.envs.sandbox import Sandbox, SandboxError
from tunix_agentic.cli.sandbox import main as cli
async def episode(**kwargs):
    env = MathPythonEnv(**kwargs)
    try:
        await env.reset(env_tasks("math_python").task(0, seed=0, split="train"))
        return "RAN " + env.sandbox.backend
    except SandboxError as exc:
        return "REFUSED " + str(exc)
    finally:
        await env.close()
async def main():
    print(await episode())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        print(await episode(sandbox={"backend": "process"}), len(caught))
    async with Sandbox() as sb:  # a sandbox made directly keeps auto's fallback
        print("DIRECT", sb.backend)
asyncio.run(main())
print("CLI", cli(["true"], config=None, backend=None, timeout=None))
print("CLI", cli(["true"], config=None, backend="process", timeout=None))
"""


@pytest.mark.skipif(not IS_ROOT, reason="hides bwrap from a child through a privileged bwrap")
@needs_bwrap
def test_without_bwrap_model_written_code_fails_closed():
    # A child that sees /dev/null where bwrap was: the binary is not executable there.
    argv = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", "/dev/null", "/usr/bin/bwrap"]
    done = subprocess.run(
        [*argv, "--", sys.executable, "-W", "ignore", "-c", _NO_BWRAP_CHILD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("REFUSED"), lines
    for needed in ("bwrap", "apt-get install bubblewrap", "backend: process"):
        assert needed in lines[0], lines[0]
    assert lines[1] == "RAN process 1"  # the explicit opt-out runs, with its warning
    assert lines[2] == "DIRECT process"
    assert lines[3:] == ["CLI 1", "CLI 0"]
    assert "apt-get install bubblewrap" in done.stderr  # the CLI says why it refused


# --- this package's sources --------------------------------------------------------------------


@needs_bwrap
async def test_the_packages_sources_are_hidden_even_under_a_bound_path():
    # As under a regular pip install, where the package lies in a bound prefix: here its
    # checkout (or site-packages folder) is bound whole. swe_lite's reference solutions
    # (envs/swe_repos.py) must not be readable, while the rest of the bound path stays.
    envs = Path(sandbox_launch.__file__).resolve().parents[1]
    hidden = sandbox_launch._hidden_dirs()  # tunix_agentic/ and envs/ (apart when editable)
    bound = Path(os.path.commonpath(hidden))
    bound = bound.parent if str(bound) in hidden else bound
    other = next(p for p in sorted(bound.iterdir()) if str(p) not in hidden)
    config = SandboxConfig(ro_paths=(*SandboxConfig().ro_paths, str(bound)), timeout_s=20)
    async with Sandbox(config) as sb:
        result = await sb.run(
            f"cat {envs}/swe_repos.py; echo files: $(ls -A {envs} | wc -l); "
            f"test -e {other} && echo other visible; touch {envs}/planted"
        )
    assert "def make_repo_task" not in result.output and "def clamp" not in result.output
    assert "No such file" in result.output and "files: 0" in result.output, result.output
    assert "other visible" in result.output, result.output
    assert not (envs / "planted").exists()


# --- the sandbox uid range ----------------------------------------------------------------------


@needs_root
async def test_a_uid_base_over_a_host_user_is_refused():
    with pytest.raises(SandboxError, match=r"65534 \(nobody\)"):
        await Sandbox.create(SandboxConfig(uid_base=65534 - 100))
    with pytest.raises(SandboxError, match=r"uid_base"):
        check_uid_range(65534 - 10, 16)


@needs_root
async def test_a_uid_base_over_a_running_process_is_refused_but_not_over_its_own_sandboxes():
    base = 50_000_000 + secrets.randbelow(400_000) * 8192
    stranger = base + 5
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={stranger}", f"--regid={stranger}", "--clear-groups", "sleep", "60"]
    )
    try:
        for _ in range(500):  # until setpriv has switched to the uid (bounds the wait only)
            if f"Uid:\t{stranger}\t" in Path(f"/proc/{proc.pid}/status").read_text():
                break
            await asyncio.sleep(0.01)
        with pytest.raises(SandboxError, match=rf"\b{stranger}\b.*running"):
            await Sandbox.create(SandboxConfig(uid_base=base))
        # Sandboxes of the range run processes in it (here two at once): not refused.
        async with Sandbox(SandboxConfig(uid_base=base + UID_SLOTS)) as a:
            async with Sandbox(SandboxConfig(uid_base=base + UID_SLOTS)) as b:
                await a.spawn(["sleep", "30"])
                await b.spawn(["sleep", "30"])
                check_uid_range(base + UID_SLOTS, UID_SLOTS)
                assert {a.uid, b.uid} == {base + UID_SLOTS, base + UID_SLOTS + 1}
    finally:
        proc.kill()
        proc.wait()


_OTHER_JOB = r"""
import asyncio, sys
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig

async def main():
    async with Sandbox(SandboxConfig(uid_base=int(sys.argv[1]), timeout_s=20)) as sb:
        done = await sb.run("id -u")
        print(sb.uid, done.output.strip(), sb.workdir)

asyncio.run(main())
"""


@needs_root
async def test_jobs_with_different_tmpdirs_never_lease_the_same_uid(tmp_path):
    # Two jobs on one host, each with its own TMPDIR (so its own sandboxes' root), in the
    # same (default-like) uid range: the second's lease must neither take the first's uid
    # nor kill its running sandbox.
    base = 50_000_000 + secrets.randbelow(400_000) * 8192
    async with Sandbox(SandboxConfig(uid_base=base, timeout_s=20)) as first:
        sleeper = await first.spawn(["sleep", "60"])
        env = {**os.environ, "TMPDIR": str(tmp_path)}
        done = subprocess.run(
            [sys.executable, "-c", _OTHER_JOB, str(base)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        uid, inside, workdir = done.stdout.split()
        assert workdir.startswith(str(tmp_path))  # the other job's own root
        assert int(uid) == int(inside) != first.uid
        assert sleeper.returncode is None  # still running
        assert (await first.run("echo alive")).output.strip() == "alive"
