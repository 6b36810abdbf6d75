"""Environments bring their own tasks: task sources, files, mixtures by environment, user
modules (config import, entry points), demonstrations, and training a user's environment."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.data.demos import DemoSource, demonstration_batches, demonstration_rows
from tunix_agentic.data.sources import RunSources
from tunix_agentic.data.tasks import FileTaskSource, heldout_tasks, task_iterator
from tunix_agentic.envs import base as envs_base
from tunix_agentic.envs.base import Action, Task, TaskSource, env_tasks, import_env_modules
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.envs.countdown import CountdownEnv, CountdownTasks
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.testing import TINY_RUN_OVERRIDES, cli

ROOT = Path(__file__).parents[1]
CONFIG = str(ROOT / "configs" / "calculator_tiny.yaml")
TEMPLATE = ChatTemplate(CharTokenizer(128))


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------ file tasks
def test_file_tasks_read_records_into_tasks_and_stream_through_grain(tmp_path):
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [{"prompt": f"Compute {i}+1.", "answer": str(i + 1), "level": i % 3} for i in range(6)],
    )
    heldout = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "Compute 9+9.", "answer": "18"}])
    source = FileTaskSource(train=train, heldout=heldout)
    assert source.num_tasks("train") == 6 and source.num_tasks("heldout") == 1
    first = source.task(0, seed=0, split="train")
    assert first == Task("train-0", "Compute 0+1.", "1", {"level": 0})
    it = task_iterator(source, seed=3)
    epoch = [next(it).task_id for _ in range(6)]
    assert sorted(epoch) == [f"train-{i}" for i in range(6)]  # each once per epoch, shuffled
    assert heldout_tasks(source, 5, seed=0) == [Task("heldout-0", "Compute 9+9.", "18")]


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"prompt": "a"}\nnot json\n', r"train.jsonl:2: not JSON"),
        ('{"answer": "1"}\n', "no 'prompt' field"),
        ("[1, 2]\n", "must be a JSON object"),
        ("\n", "holds no records"),
    ],
    ids=["bad-json", "no-prompt", "not-object", "empty"],
)
def test_file_tasks_name_the_bad_record(tmp_path, content, message):
    path = tmp_path / "train.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        FileTaskSource(train=path)


def test_json_array_files_and_unknown_suffixes(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"prompt": "Compute 2+2.", "answer": 4}]))
    assert FileTaskSource(train=path).task(0, seed=0, split="train").answer == 4
    path.write_text(json.dumps({"prompt": "x"}))
    with pytest.raises(ValueError, match="holds a list of JSON objects"):
        FileTaskSource(train=path)
    other = tmp_path / "train.csv"
    other.write_text("prompt\n")
    with pytest.raises(ValueError, match=r"must be .jsonl, .json or .parquet"):
        FileTaskSource(train=other)


def test_parquet_without_pyarrow_says_what_to_install(tmp_path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        path = tmp_path / "t.parquet"
        path.write_bytes(b"PAR1")
        with pytest.raises(ValueError, match="needs pyarrow"):
            FileTaskSource(train=path)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "Compute 1+2.", "answer": "3"}]), path)
    assert FileTaskSource(train=path).task(0, seed=0, split="train").prompt == "Compute 1+2."


# ------------------------------------------------------------------ countdown
def test_countdown_tasks_are_deterministic_solvable_and_split():
    source = CountdownTasks()
    tasks = [source.task(i, seed=1, split="train") for i in range(200)]
    assert tasks == [source.task(i, seed=1, split="train") for i in range(200)]
    env = CountdownEnv()
    for task in tasks[:50]:
        asyncio.run(env.reset(task))
        assert env.score(task.data["solution"]) == 1.0
        assert 10 <= task.answer <= 999
    held = {(tuple(t.data["numbers"]), t.answer) for t in heldout_tasks(source, 200, seed=1)}
    assert not held & {(tuple(t.data["numbers"]), t.answer) for t in tasks}


@pytest.mark.parametrize(
    "answer,reward",
    [
        ("(50-25)*4", 1.0),
        ("4*(50-25)", 1.0),
        ("100/4*4", 0.0),  # 100 is not given
        ("50*4-25*4", 0.0),  # 4 twice
        ("50+25+4", 0.5),  # valid, misses: the format reward
        ("50+__import__('os')", 0.0),
        ("50 **2", 0.0),
        ("", 0.0),
    ],
    ids=["solved", "commuted", "foreign-number", "reused", "miss", "name", "power", "empty"],
)
def test_countdown_scores_answers(answer, reward):
    env = CountdownEnv(format_reward=0.5)
    task = Task("t", "Make 100 from 4 25 50 ...", 100, {"numbers": [4, 25, 50]})

    async def episode():
        await env.reset(task)
        result = await env.step(Action(text="", answer=answer))
        return result, await env.evaluate()

    result, final = asyncio.run(episode())
    assert result.done and result.reward == final == reward


def test_countdown_tool_call_then_answer():
    env = CountdownEnv()
    task = CountdownTasks().task(0, seed=0, split="train")
    messages = CountdownTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)

    async def replay():
        from tunix_agentic.envs.base import ToolCall

        await env.reset(task)
        call = messages[0]["tool_calls"][0]
        obs = await env.step(Action(text="", tool_calls=(ToolCall(**call),)))
        done = await env.step(Action(text="", answer=task.data["solution"]))
        return obs, done, await env.evaluate()

    obs, done, reward = asyncio.run(replay())
    assert obs.messages == [{"role": "tool", "content": messages[1]["content"]}]
    assert done.done and reward == 1.0


# ------------------------------------------------------------- demonstrations
def test_demonstration_rows_mask_only_the_assistant():
    task = ArithmeticTasks().task(0, seed=0, split="train")
    messages = ArithmeticTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)
    tools = ArithmeticEnv().tool_schemas()
    row = demonstration_rows(task.prompt, messages, TEMPLATE, tools=tools)
    ids, mask = row["input_ids"].tolist(), row["loss_mask"]
    prompt = TEMPLATE.prompt_ids(task.prompt, tools=tools)
    assert ids[: len(prompt)] == prompt and not mask[: len(prompt)].any()
    decoded = TEMPLATE.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert '"expression"' in decoded and f"<answer>{task.answer}</answer>" in decoded
    assert task.answer in TEMPLATE.tokenizer.decode(
        [i for i, m in zip(ids, mask, strict=True) if not m]
    )
    with pytest.raises(ValueError, match="starts with an assistant"):
        demonstration_rows("p", [{"role": "user", "content": "x"}], TEMPLATE)
    with pytest.raises(ValueError, match="ends with the assistant"):
        demonstration_rows("p", messages[:2], TEMPLATE)


def test_demonstrations_mix_sources_by_weight():
    sources = {
        "arith": DemoSource(ArithmeticTasks(), ArithmeticEnv().tool_schemas(), 3.0),
        "count": DemoSource(CountdownTasks(), CountdownEnv().tool_schemas(), 1.0),
    }
    rows = next(demonstration_batches(sources, TEMPLATE, seed=0, batch_size=8, tool_fraction=0))
    texts = [TEMPLATE.tokenizer.decode(row["input_ids"].tolist()) for row in rows]
    assert sum("Make " in t for t in texts) == 2 and sum("Compute " in t for t in texts) == 6

    class NoDemos(TaskSource):
        def task(self, index, *, seed, split):
            return Task(str(index), "p")

    with pytest.raises(ValueError, match="'none' provides no demonstrations"):
        next(
            demonstration_batches(
                {"none": DemoSource(NoDemos(), [])}, TEMPLATE, seed=0, batch_size=1, tool_fraction=0
            )
        )


# --------------------------------------------------------- config and routing
def test_config_resolves_sources_and_routes_tasks_to_their_environment():
    cfg = load_config(
        CONFIG,
        [
            "tasks=[{env: countdown, weight: 3, env_kwargs: {format_reward: 0.1}}, {env: arithmetic}]"
        ],
    )
    assert [(t.name, t.env, t.weight) for t in cfg.tasks] == [
        ("countdown", "countdown", 3.0),
        ("arithmetic", "arithmetic", 1.0),
    ]
    sources = RunSources(cfg.tasks, tool_timeout=2.0)
    stream = sources.train_stream(seed=0)
    tasks = [next(stream) for _ in range(8)]
    assert [t.task_name for t in tasks].count("countdown") == 6
    for task in tasks:
        env = sources.make_env(task)
        kind = CountdownEnv if task.task_name == "countdown" else ArithmeticEnv
        assert isinstance(env, kind) and env.tool_timeout == 2.0
        if kind is CountdownEnv:
            assert env.format_reward == 0.1
    held = sources.heldout(3, seed=0)
    assert {name: len(ts) for name, ts in held.items()} == {"countdown": 3, "arithmetic": 3}
    assert all(t.task_name == name for name, ts in held.items() for t in ts)


@pytest.mark.parametrize(
    "override,message",
    [
        ("env.name=nope", "env.name: unknown environment 'nope'"),
        ("tasks=[{env: nope}]", r"tasks\[0\].env: unknown environment 'nope'"),
        ("tasks=[{env: countdown}, {env: countdown}]", "tasks names must be distinct"),
        ("env.import=no_such_module_xyz", "cannot import environment module 'no_such_module_xyz'"),
        ("tasks=[{env: arithmetic, weight: 0}]", "weight must be > 0"),
    ],
    ids=["env", "task-env", "duplicate", "import", "weight"],
)
def test_config_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(CONFIG, [override])


def test_a_source_without_tasks_needs_files(tmp_path, monkeypatch):
    monkeypatch.setattr(envs_base, "_REGISTRY", dict(envs_base._REGISTRY))  # undone after

    @envs_base.register_env("test_taskless")
    class Taskless(ArithmeticEnv):
        pass

    cfg = load_config(CONFIG, ["tasks=[{env: test_taskless}]"])
    with pytest.raises(ValueError, match="registers no task source; give tasks"):
        RunSources(cfg.tasks)
    train = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "Compute 1+1.", "answer": "2"}])
    cfg = load_config(CONFIG, [f"tasks=[{{env: test_taskless, train_file: '{train}'}}]"])
    assert next(RunSources(cfg.tasks).train_stream(0)).prompt == "Compute 1+1."


def test_user_module_from_the_working_directory_and_a_file(tmp_path, monkeypatch):
    (tmp_path / "user_env_mod_a.py").write_text(
        textwrap.dedent(
            """
            from tunix_agentic.envs import register_env
            from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks

            @register_env("user_env_a", tasks=ArithmeticTasks())
            class A(ArithmeticEnv):
                pass
            """
        )
    )
    (tmp_path / "user_env_mod_b.py").write_text(
        "from tunix_agentic.envs import register_env\n"
        "from tunix_agentic.envs.calculator import ArithmeticEnv\n"
        "register_env('user_env_b')(ArithmeticEnv)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    cfg = load_config(
        CONFIG, ["env.import=[user_env_mod_a, ./user_env_mod_b.py]", "env.name=user_env_a"]
    )
    # a file is kept by its absolute path, so a resume from elsewhere finds it
    assert cfg.env.imports == ("user_env_mod_a", str(tmp_path / "user_env_mod_b.py"))
    assert isinstance(env_tasks("user_env_a"), ArithmeticTasks)
    assert env_tasks("user_env_b") is None
    import_env_modules("./user_env_mod_b.py")  # a second import is a no-op
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        (tmp_path / "broken_env_mod.py").write_text("1/0\n")
        import_env_modules("broken_env_mod")


def test_entry_point_group_registers_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "ep_env_mod.py").write_text(
        "from tunix_agentic.envs import register_env\n"
        "from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks\n"
        "register_env('ep_env', tasks=ArithmeticTasks())(ArithmeticEnv)\n"
    )
    dist = tmp_path / "ep_env_dist-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-env-dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tunix_agentic.envs]\nep_env = ep_env_mod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(envs_base, "_ENTRY_POINTS_LOADED", False)
    assert isinstance(envs_base.make_env("ep_env"), ArithmeticEnv)
    assert load_config(CONFIG, ["env.name=ep_env"]).env.name == "ep_env"


# ------------------------------------------------------------- training runs
def test_a_mixed_two_environment_run_reports_each(tmp_path):
    from tunix_agentic.metrics import read_scalars
    from tunix_agentic.trainer import train

    run = tmp_path / "mixed"
    result = train(
        CONFIG,
        [
            *TINY_RUN_OVERRIDES,
            "engine.max_seq_len=256",
            "rl.steps=2",
            "sft.steps=5",
            "rl.eval_tasks=4",
            "tasks=[{env: arithmetic}, {env: countdown}]",
            f"run_dir={run}",
        ],
        progress=False,
    )
    assert set(result.by_task_after) == {"arithmetic", "countdown"}
    assert "\n  countdown: " in result.summary() and "\n  arithmetic: " in result.summary()
    scalars = read_scalars(run / "tensorboard")
    for name in ("arithmetic", "countdown"):
        assert f"eval/success_fraction/{name}" in scalars
        assert f"rollout/reward_mean/{name}" in scalars
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["eval_after"]["by_task"]) == {"arithmetic", "countdown"}


def readme_example() -> str:
    """The example environment in the docs (docs/writing_environments.md)."""
    text = (ROOT / "docs" / "writing_environments.md").read_text()
    match = re.search(r"<!-- example: my_guess.py.*?-->\n```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/writing_environments.md's environment example is missing"
    return match.group(1)


def test_the_readme_example_environment_trains_from_the_cli(tmp_path):
    (tmp_path / "my_guess.py").write_text(readme_example())
    cmd = cli(
        "train",
        "--quiet",
        "--config",
        CONFIG,
        "env.import=my_guess",
        "env.name=guess",
        "agent.max_turns=6",
        "sft.steps=20",
        "rl.steps=1",
        "rl.eval_tasks=2",
        *TINY_RUN_OVERRIDES,
        "engine.max_seq_len=256",
        f"run_dir={tmp_path / 'run'}",
    )
    # `python -c` puts no directory of the user's on sys.path: the working directory is
    # found as the console script would find it.
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"held-out success: \d\.\d\d -> \d\.\d\d \(1 steps", done.stdout)
    # No TPU here (libtpu installed in CI): the CLI keeps JAX on the CPU without the TPU
    # runtime's five error lines (JAX_PLATFORMS is not set for this process).
    assert "JAX_PLATFORMS" not in os.environ
    assert "E0000" not in done.stderr and "host bounds" not in done.stderr, done.stderr[:2000]


def test_the_readme_example_replays_its_demonstrations():
    namespace: dict = {}
    exec(compile(readme_example(), "my_guess.py", "exec"), namespace)  # noqa: S102
    source, env = namespace["GuessTasks"](), namespace["GuessEnv"]()

    async def replay(task):
        assert await env.reset(task) == task.prompt
        turns = source.demonstration(task, rng=None, use_tools=False)
        results = []
        for turn in turns[::2]:
            answer = re.search(r"<answer>(.*)</answer>", turn["content"]).group(1)
            results.append(await env.step(Action(text=turn["content"], answer=answer)))
        return turns, results, await env.evaluate()

    for i in range(10):
        task = source.task(i, seed=0, split="train")
        turns, results, reward = asyncio.run(replay(task))
        assert reward == 1.0 and results[-1].done
        assert [r.observation for r in results[:-1]] == [t["content"] for t in turns[1::2]]


def test_the_countdown_config_loads_and_builds_its_sources():
    cfg = load_config(ROOT / "configs" / "countdown_tiny.yaml")
    sources = RunSources(cfg.tasks, tool_timeout=cfg.env.tool_timeout_s)
    task = next(sources.train_stream(cfg.seed))
    assert isinstance(sources.make_env(task), CountdownEnv) and task.task_name == "countdown"
    assert set(sources.demo_sources()) == {"countdown"}


def test_a_remote_source_takes_its_tasks_from_the_served_environment():
    from tunix_agentic.envs.remote import RemoteEnv

    cfg = load_config(
        CONFIG,
        [
            "tasks=[{name: lake, env: remote, tasks_from: frozenlake, "
            "env_kwargs: {url: 'http://127.0.0.1:9', env: frozenlake}}]"
        ],
    )
    sources = RunSources(cfg.tasks, tool_timeout=1.0)
    task = next(sources.train_stream(0))
    env = sources.make_env(task)
    assert isinstance(env, RemoteEnv) and env.env_name == "frozenlake"
    assert task.task_name == "lake" and "grid" in task.data
    with pytest.raises(ConfigError, match=r"tasks\[0\].tasks_from: unknown environment"):
        load_config(CONFIG, ["tasks=[{env: remote, tasks_from: nope}]"])
    with pytest.raises(ValueError, match="'remote' registers no task source"):
        RunSources(load_config(CONFIG, ["tasks=[{env: remote}]"]).tasks)


def test_env_kwargs_stay_the_environments_own_across_a_saved_config(tmp_path):
    from tunix_agentic.config import save_config

    cfg = load_config(CONFIG, ["env.name=countdown", "env.kwargs={format_reward: 0.1}"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml", ["env.kwargs.format_reward=0.3"])
    sources = RunSources(again.tasks, env_name=again.env.name, env_kwargs=again.env.kwargs)
    env = sources.make_env(next(sources.train_stream(0)))
    assert env.format_reward == 0.3  # the override wins, as it would on --resume
    assert again.tasks[0].env_kwargs == {}


def test_arithmetic_takes_tasks_from_a_file(tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "Compute 6*7.", "answer": 42}])
    cfg = load_config(CONFIG, [f"tasks=[{{train_file: '{train}'}}]"])
    sources = RunSources(cfg.tasks, env_name=cfg.env.name)
    task = next(sources.train_stream(0))
    env = sources.make_env(task)

    async def episode():
        assert await env.reset(task) == "Compute 6*7."
        await env.step(Action(text="", answer="42"))
        return await env.evaluate()

    assert asyncio.run(episode()) == 1.0
    assert sources.heldout(5, seed=0) == {}  # no held-out file: not scored as 0.00


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["env.name=countdown", "env.kwargs={formt_reward: 1}"],
            "env.kwargs: environment 'countdown' takes no keyword 'formt_reward'; did you mean "
            "'format_reward'\\? \\(it takes: tool_timeout, format_reward\\)",
        ),
        (["tasks=[{heldout_file: HELD}]"], "has no train tasks"),
        (["seed=4294967295", "tasks=[{env: arithmetic, seed_offset: 1}]"], "seed must be in"),
        (
            ["env.name=remote", "tasks=[{tasks_from: arithmetic}]", "sft.steps=0"],
            r"needs the keyword\(s\) url",
        ),
        (["tasks=[{train_file: TRAIN}]"], "provides demonstrations"),
    ],
    ids=["misspelt-kwarg", "heldout-only", "seed-range", "remote-without-url", "no-demos"],
)
def test_a_trainer_refuses_a_run_that_cannot_go_before_any_work(tmp_path, overrides, message):
    from tunix_agentic.trainer import Trainer

    held = write_jsonl(tmp_path / "h.jsonl", [{"prompt": "Compute 1+1.", "answer": 2}])
    overrides = [o.replace("HELD", str(held)).replace("TRAIN", str(held)) for o in overrides]
    cfg = load_config(CONFIG, [*overrides, f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=message):
        Trainer(cfg, progress=False)
    assert not (tmp_path / "run").exists()


def test_the_remote_config_routes_episodes_to_the_served_environment():
    from tunix_agentic.envs.remote import RemoteEnv

    cfg = load_config(ROOT / "configs" / "remote_countdown_tiny.yaml")
    sources = RunSources(cfg.tasks, env_name=cfg.env.name, env_kwargs=cfg.env.kwargs)
    task = next(sources.train_stream(cfg.seed))
    env = sources.make_env(task)
    assert isinstance(env, RemoteEnv) and env.env_name == "countdown"
    assert env.url.startswith("http://127.0.0.1:8100") and "numbers" in task.data
