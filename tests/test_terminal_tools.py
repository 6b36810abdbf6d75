"""Tests for the sandbox tools: ``bash`` (envs/tools/terminal.py), ``python``
(envs/tools/python_tool.py) and ``file_edit`` (envs/tools/file_edit.py), on real sandboxes."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import warnings
from pathlib import Path

import pytest

from tunix_agentic.envs.sandbox import (
    Sandbox,
    SandboxConfig,
    SandboxIsolationWarning,
    bwrap_problem,
)
from tunix_agentic.envs.tools import (
    BashTool,
    FileEditTool,
    PythonTool,
    ToolCall,
    ToolUnavailable,
    call_tool,
)
from tunix_agentic.envs.tools.terminal import ansi_c_quote, clean_terminal_output

pytestmark = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bwrap: {bwrap_problem()}")


@pytest.fixture
async def sandbox():
    async with Sandbox(SandboxConfig(timeout_s=10)) as sb:
        yield sb


# --- bash -----------------------------------------------------------------------------------------


async def test_bash_state_persists_between_calls(sandbox):
    bash = BashTool(sandbox)
    assert await bash.run("mkdir -p proj && cd proj && export GREETING=hello") == "(no output)"
    assert await bash.run("pwd; echo $GREETING") == "/workspace/proj\nhello"
    await bash.run("add() { echo $(($1 + $2)); }")
    assert await bash.run("add 40 2") == "42"
    assert (sandbox.workdir / "proj").is_dir()


async def test_bash_reports_exit_codes_and_keeps_quoting_intact(sandbox):
    bash = BashTool(sandbox)
    assert await bash.run("echo oops >&2; false") == "oops\n[exit code: 1]"
    assert await bash.run("(exit 7)") == "[exit code: 7]"
    tricky = "printf '%s|' \"it's\" '$HOME' \"a\\\\b\" '!x' 'é✓'; echo"
    assert await bash.run(tricky) == "it's|$HOME|a\\b|!x|é✓|"
    # An unclosed quote is a syntax error, not a shell waiting forever for more input.
    out = await bash.run("echo 'unclosed")
    assert "[exit code: 2]" in out
    assert await bash.run("echo next") == "next"


async def test_bash_long_commands_and_multiline_scripts(sandbox):
    bash = BashTool(sandbox)
    long_value = "x" * 9000  # over the terminal's 4096-byte line limit
    assert await bash.run(f"v={long_value}; echo ${{#v}}") == "9000"
    script = "cat > s.sh <<'EOF'\nfor i in 1 2 3; do\n  echo line $i\ndone\nEOF\nbash s.sh"
    assert await bash.run(script) == "line 1\nline 2\nline 3"


async def test_bash_timeout_interrupts_and_keeps_the_shell(sandbox):
    bash = BashTool(sandbox, timeout=1.0)
    await bash.run("cd /tmp; export KEPT=yes")
    t0 = time.perf_counter()
    out = await bash.run("echo started; sleep 30")
    assert time.perf_counter() - t0 < 5
    assert out.startswith("started") and "timed out after 1s and was interrupted" in out
    assert await bash.run("pwd; echo $KEPT") == "/tmp\nyes"  # same shell
    # A command that reads the terminal is interrupted too.
    assert "interrupted" in await bash.run("cat")
    assert await bash.run("echo fine") == "fine"


async def test_bash_restarts_a_shell_that_ignores_the_interrupt(sandbox):
    bash = BashTool(sandbox, timeout=0.5, interrupt_grace_s=0.5)
    await bash.run("cd /tmp; export LOST=yes")
    out = await bash.run("trap '' INT; while :; do :; done")
    assert "the shell was restarted" in out and "reset" in out
    assert await bash.run("pwd; echo ${LOST:-unset}") == "/workspace\nunset"


async def test_bash_exit_starts_a_fresh_shell(sandbox):
    bash = BashTool(sandbox)
    await bash.run("export A=1")
    out = await bash.run("exit 3")
    assert "the shell exited with exit code 3" in out
    assert await bash.run("echo ${A:-fresh}") == "fresh"


async def test_bash_truncates_long_output_with_a_marker(sandbox):
    bash = BashTool(sandbox, max_output_chars=200)
    out = await bash.run("seq 1 100000")
    assert len(out) < 300
    assert out.startswith("1\n2\n3\n") and out.endswith("99999\n100000")
    marker = out.split("[... ")[1].split(" characters truncated ...]")[0]
    assert int(marker) > 500_000


async def test_bash_cleans_terminal_noise(sandbox):
    bash = BashTool(sandbox)
    assert await bash.run("printf 'working\\rdone\\n'; printf '\\033[31mred\\033[0m\\n'") == (
        "done\nred"
    )
    assert clean_terminal_output("a\r\nb\x1b[1mc\x1b[0m") == "a\nbc"
    assert ansi_c_quote("a'b\\c\nd\x03") == "a\\'b\\\\c\\x0ad\\x03"


async def test_bash_through_call_tool_and_after_close():
    sb = await Sandbox.create()
    bash = BashTool(sb)
    tools = {"bash": bash}
    result = await call_tool(tools, ToolCall("bash", {"command": "echo via call_tool"}))
    assert not result.error and result.output == "via call_tool"
    bad = await call_tool(tools, ToolCall("bash", {"cmd": "ls"}))
    assert bad.error and "missing required argument" in bad.output
    await sb.close()
    with pytest.raises(ToolUnavailable):
        await call_tool(tools, ToolCall("bash", {"command": "echo again"}))


async def test_tools_cancelled_by_call_tool_restart_and_say_so(sandbox):
    tools = {"bash": BashTool(sandbox), "python": PythonTool(sandbox)}
    await tools["bash"].run("export GONE=1")
    await tools["python"].run("gone = 1")
    for call in (
        ToolCall("bash", {"command": "sleep 20"}),
        ToolCall("python", {"code": "while 1: pass"}),
    ):
        t0 = time.perf_counter()
        result = await call_tool(tools, call, timeout=0.5)
        assert result.error and "timed out after 0.5s" in result.output
        assert time.perf_counter() - t0 < 3
    bash_out = await tools["bash"].run("echo ${GONE:-unset}")
    assert "cancelled" in bash_out and bash_out.endswith("unset")
    py_out = await tools["python"].run("'gone' in globals()")
    assert "cancelled" in py_out and py_out.endswith("False")


# --- python ---------------------------------------------------------------------------------------


async def test_python_state_persists_and_shows_the_last_expression(sandbox):
    py = PythonTool(sandbox)
    assert await py.run("import math\nx = 40") == "(no output)"
    assert await py.run("print('sum:', x + 2)\nmath.sqrt(x + 9)") == "sum: 42\n7.0"
    assert await py.run("def f(n):\n    return n * 2\nf(x)") == "80"
    assert await py.run("None") == "(no output)"
    assert await py.run("import os; os.system('echo from a subprocess'); os.getcwd()") == (
        "from a subprocess\n'/workspace'"
    )


async def test_python_errors_come_back_as_the_last_traceback_line(sandbox):
    py = PythonTool(sandbox)
    assert await py.run("print('before')\n1 / 0") == "before\nZeroDivisionError: division by zero"
    assert await py.run("def broken(:") == "SyntaxError: invalid syntax"
    assert await py.run("undefined_name") == "NameError: name 'undefined_name' is not defined"
    assert await py.run("input()") == "EOFError: EOF when reading a line"
    assert await py.run("raise SystemExit(4)") == "SystemExit: 4"
    assert await py.run("'still alive'") == "'still alive'"


async def test_python_call_cap(sandbox):
    py = PythonTool(sandbox, max_calls=2)
    assert await py.run("n = 1") == "(no output)"
    assert await py.run("n") == "1"
    out = await py.run("n")
    assert out.startswith("error: ") and "limit of 2 calls" in out
    assert py.calls == 2


async def test_python_timeout_restarts_and_says_state_was_lost(sandbox):
    py = PythonTool(sandbox, timeout=1.0)
    await py.run("kept = 'value'")
    t0 = time.perf_counter()
    out = await py.run("while True:\n    pass")
    assert time.perf_counter() - t0 < 5
    assert out.startswith("error: ") and "timed out after 1s" in out and "lost" in out
    assert await py.run("kept") == "NameError: name 'kept' is not defined"
    assert await py.run("'restarted'") == "'restarted'"


async def test_python_interpreter_death_is_reported(sandbox):
    py = PythonTool(sandbox)
    await py.run("y = 1")
    out = await py.run("import os; os._exit(5)")
    assert out.startswith("error: ") and "exit code 5" in out and "lost" in out
    assert await py.run("'back'") == "'back'"


async def test_python_truncates_long_output(sandbox):
    py = PythonTool(sandbox, max_output_chars=300)
    out = await py.run("for i in range(100000): print(i)")
    assert len(out) < 400 and "characters truncated ...]" in out
    assert out.startswith("0\n1\n") and out.endswith("99999")


async def test_python_after_close_is_unavailable():
    sb = await Sandbox.create()
    py = PythonTool(sb)
    assert await py.run("1 + 1") == "2"
    await sb.close()
    with pytest.raises(ToolUnavailable):
        await py.run("2 + 2")


async def test_python_after_the_code_filled_the_disk_still_runs_and_reports():
    # The code fills the sandbox's scratch disk and exits: the next start must not fail as
    # an infrastructure fault (ToolUnavailable), and the output of later cells comes back.
    async with Sandbox(SandboxConfig(disk_mb=8, file_size_mb=64, timeout_s=20)) as sb:
        py = PythonTool(sb)
        fill = (
            "import os\nfd = os.open('/tmp/fill', os.O_WRONLY | os.O_CREAT)\n"
            "try:\n    os.write(fd, b'x' * (32 << 20))\nexcept OSError:\n    pass\n"
            "os._exit(0)"
        )
        assert "exit code 0" in await py.run(fill)
        more = (
            "print('after'); os.write(os.open('/tmp/more', os.O_WRONLY | os.O_CREAT), b'y' * 8192)"
        )
        assert await py.run("import os; " + more) == (
            "after\nOSError: [Errno 28] No space left on device"
        )


async def test_python_start_refused_after_code_ran_is_the_agents_not_infrastructure():
    async with Sandbox(SandboxConfig(max_procs=4, timeout_s=20)) as sb:
        if sb.totals is None or not str(sb.totals.processes).startswith("cgroup"):
            pytest.skip("needs the sandbox's process cgroup (root)")
        # A first start that fails is infrastructure: nothing of the agent's ran yet.
        with pytest.raises(ToolUnavailable):
            await PythonTool(sb, startup_timeout_s=1e-6).run("1")
        # Processes left behind by earlier commands take the sandbox's process limit: started
        # one at a time until the limit refuses one.
        hogs = []
        for _ in range(40):
            hog = await sb.spawn(["sleep", "60"])
            try:
                await asyncio.wait_for(asyncio.shield(hog.exited()), 0.5)
                break  # refused: the limit is taken
            except TimeoutError:
                hogs.append(hog)
        py = PythonTool(sb, startup_timeout_s=10)
        result = await call_tool({"python": py}, ToolCall(name="python", arguments={"code": "1"}))
        assert result.output.startswith("error: the Python interpreter could not start")
        assert "Resource temporarily unavailable" in result.output, result.output
        for hog in hogs:
            await sb.terminate(hog)
        assert await py.run("6 * 7") == "42"


# --- file_edit ------------------------------------------------------------------------------------


async def test_file_edit_create_view_replace(sandbox):
    fe = FileEditTool(sandbox)
    assert await fe.run("create", "src/app.py", text="a = 1\nb = 2\nc = 3\n") == (
        "created src/app.py (3 lines)"
    )
    assert await fe.run("view", "src/app.py") == "     1\ta = 1\n     2\tb = 2\n     3\tc = 3\n"
    assert await fe.run("view", "/workspace/src/app.py", start_line=2, end_line=2) == (
        "     2\tb = 2\n"
    )
    out = await fe.run("replace", "src/app.py", start_line=2, end_line=3, text="b = 20\nc = 30")
    assert out.startswith("replaced 2 line(s) at 2 of src/app.py with 2 line(s)")
    await fe.run("replace", "src/app.py", start_line=1, end_line=0, text="# header")  # insert
    await fe.run("replace", "src/app.py", start_line=2, text="")  # delete line 2
    assert sandbox.read_file("src/app.py") == "# header\nb = 20\nc = 30\n"
    assert await fe.run("view", "src") == "app.py"
    assert "src/" in await fe.run("view", ".")
    # The sandbox's own processes can use (and edit) what the tool made.
    bash = BashTool(sandbox)
    assert await bash.run("echo 'd = 4' >> src/app.py && python3 -c 'print(1)'") == "1"
    assert (await fe.run("view", "src/app.py")).endswith("     4\td = 4\n")


async def test_file_edit_reports_the_agents_mistakes(sandbox):
    fe = FileEditTool(sandbox)
    await fe.run("create", "f.txt", text="only\n")
    cases = {
        ("create", "f.txt"): "already exists",
        ("view", "missing.txt"): "no such file",
        ("explode", "f.txt"): "unknown command",
    }
    for (command, path), expected in cases.items():
        out = await fe.run(command, path, text="x")
        assert out.startswith("error: ") and expected in out, out
    assert "out of range" in await fe.run("view", "f.txt", start_line=5)
    assert "out of range" in await fe.run("replace", "f.txt", start_line=1, end_line=9, text="x")
    assert "needs start_line" in await fe.run("replace", "f.txt", text="x")
    sandbox.write_file("blob.bin", b"\x00\x01\x02")
    assert "binary" in await fe.run("view", "blob.bin")


async def test_file_edit_cannot_escape_the_workdir(sandbox, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host file\n")
    os.chmod(tmp_path, 0o755)
    bash = BashTool(sandbox)
    await bash.run(
        f"ln -s {outside} abs_link; ln -s ../../../../../../etc rel_link; mkfifo pipe; "
        "mkdir inner; ln -s /workspace/inner ok_link"
    )
    fe = FileEditTool(sandbox)
    for path in ("../x", "/etc/passwd", "abs_link", "rel_link/passwd", str(outside)):
        out = await fe.run("view", path)
        assert out.startswith("error: ") and "host file" not in out, (path, out)
        out = await fe.run("replace", path, start_line=1, text="pwned")
        assert out.startswith("error: "), (path, out)
    assert (await fe.run("create", "abs_link", text="pwned")).startswith("error: ")
    assert (await fe.run("view", "pipe")).startswith("error: ")  # does not block on a FIFO
    assert outside.read_text() == "host file\n"
    assert "pwned" not in Path("/etc/passwd").read_text()
    # Links that stay inside work.
    await fe.run("create", "ok_link/note.txt", text="inside\n")
    assert sandbox.read_file("inner/note.txt") == "inside\n"


async def test_file_edit_refuses_hard_links(sandbox):
    sandbox.write_file("orig.txt", "one\n")
    bash = BashTool(sandbox)
    await bash.run("ln orig.txt twin.txt")
    out = await FileEditTool(sandbox).run("replace", "twin.txt", start_line=1, text="two")
    assert out.startswith("error: ") and "hard links" in out
    assert sandbox.read_file("orig.txt") == "one\n"


# --- the process backend --------------------------------------------------------------------------


async def test_tools_run_on_the_process_backend():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxIsolationWarning)
        sb = await Sandbox.create(SandboxConfig(backend="process"))
    try:
        bash, py = BashTool(sb, timeout=1.0), PythonTool(sb)
        assert await bash.run("cd sub 2>/dev/null || mkdir sub && cd sub; pwd") == str(
            sb.workdir / "sub"
        )
        assert "interrupted" in await bash.run("sleep 20")
        assert await bash.run("basename $PWD") == "sub"
        assert await py.run("z = 6 * 7\nz") == "42"
        assert await FileEditTool(sb).run("view", "sub") == "sub is an empty directory"
    finally:
        await sb.close()


# --- a hostile agent's own code -------------------------------------------------------------------

# Agent code that finds the driver's private reply pipe (its frame's ``proto_out``) and writes a
# frame header claiming 3 GB, then 256 MiB of filler.
_FLOOD_REPLY_PIPE = """
import sys
frame = sys._getframe()
while "proto_out" not in frame.f_locals:
    frame = frame.f_back
pipe = frame.f_locals["proto_out"]
pipe.write(b"3000000000\\n")
chunk = b"x" * (1 << 20)
for _ in range(256):
    pipe.write(chunk)
"""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_python_refuses_a_huge_reply_frame_and_holds_bounded_memory(sandbox):
    py = PythonTool(sandbox)
    await py.run("kept = 1")
    baseline, peak, done = _rss_bytes(), [0], asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes() - baseline)
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    try:
        out = await py.run(_FLOOD_REPLY_PIPE)
    finally:
        done.set()
        await sampler
    assert peak[0] < 64 << 20, f"the host buffered {peak[0] >> 20} MiB of a 256 MiB flood"
    assert out.startswith("error: ") and "3000000000" in out and "restarted" in out
    assert "lost" in out
    assert await py.run("kept") == "NameError: name 'kept' is not defined"
    assert await py.run("1 + 1") == "2"


@pytest.mark.parametrize(
    "planted",
    ["tempfile.py", "json.py", "os.py", "ast.py", "traceback.py", "signal.py"],
    ids=["tempfile", "json", "os", "ast", "traceback", "signal"],
)
async def test_python_driver_ignores_stdlib_shadows_in_the_workdir(sandbox, planted):
    (sandbox.workdir / planted).write_text("import os\nos._exit(3)\n")
    (sandbox.workdir / "helper_mod.py").write_text("VALUE = 42\n")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    user_site = sandbox.workdir / ".local" / "lib" / version / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "user_mod.py").write_text("VALUE = 7\n")
    py = PythonTool(sandbox)
    assert await py.run("1 + 1") == "2"
    # The agent's own modules (working directory, user site) still import, as for `python`.
    assert await py.run("import helper_mod, user_mod\nhelper_mod.VALUE + user_mod.VALUE") == "49"
    assert await py.run("import sys\nsys.dont_write_bytecode") == "True"


async def test_bash_reads_no_startup_file_the_agent_planted(sandbox):
    for name in (".bashrc", ".bash_profile", ".profile", ".bash_login"):
        (sandbox.workdir / name).write_text("exit 3\n")
    (sandbox.workdir / ".inputrc").write_text('"\\C-m": "exit 3"\n')
    (sandbox.workdir / ".bash_history").write_text("echo planted-history\n" * 1000)
    bash = BashTool(sandbox)
    assert await bash.run("echo alive") == "alive"
    assert "planted-history" not in await bash.run("set -o history; history")
