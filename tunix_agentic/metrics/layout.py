"""The custom-scalars layout every run writes: what TensorBoard shows first.

TensorBoard's scalars dashboard lists a run's ~100 tags alphabetically; the
custom-scalars dashboard ("CUSTOM SCALARS") instead opens on the categories
below, each a few charts whose lines are picked by regular expressions (a
chart draws every tag the regex matches in full), so per-task, per-tool and
per-env names need no listing:

* **Reward and success**: reward and success per task (training batches) and
  held-out success.
* **Engine: busy / host gap / idle**: the engine's wall time split three ways,
  and generated tokens per wall second and per accelerator second.
* **Seconds per RL step by stage**: the step's wall time, the episode stages
  (INIT / RUN / EVAL) and the learner's parts (wait for batch, train, weight
  sync).
* **Queue depths**: the rollout gauges (ready and in-flight groups, ...).
* **Latency percentiles**: p50 / p95 / p99 of whole episodes (admission to
  reward), the reward (EVAL), model calls, env steps, tool calls by tool and
  environment start-up (``env/<key>``, e.g. a sandbox's start).

The layout is one ``custom_scalars__config__`` tensor event written with
TensorBoard's own protos (no TensorFlow); see :func:`write_layout`. The
custom-scalars charts draw lines, not stacked areas.

Where the operating metrics live (``<q>`` is p50, p95 or p99, in seconds, over
the spans of one RL step; ``hist/<span>`` holds the same samples):

* trajectory completion (admission to reward): ``latency/episode/<q>``;
* reward computation (EVAL): ``latency/stage/eval/<q>``;
* tool call latency by tool: ``latency/tool/<name>/<q>``;
* sandbox / environment start-up: ``latency/env/<key>/<q>`` (what the env reports);
* model calls, env steps: ``latency/model_call/<q>``, ``latency/env_step/<q>``;
* trainer wait, weight sync: ``time/wait_for_batch_s``, ``time/weight_sync_s`` (per
  step) and ``latency/wait_for_batch/<q>``, ``latency/weight_sync/<q>``;
* accelerator idle: ``engine/idle_fraction`` beside ``engine/busy_fraction`` and
  ``engine/sched_gap_fraction`` (host gap);
* rollout queues: ``gauge/queue/ready_groups``, ``gauge/queue/in_flight_groups``
  (and ``..._max`` within the step);
* tokens per accelerator-second: ``throughput/generated_tokens_per_accelerator_s``
  (tokens the engines generated in the step / their busy seconds in it), beside
  ``throughput/generated_tokens_per_s`` (the batch's tokens / the step's wall time).
"""

from __future__ import annotations

from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.custom_scalar import layout_pb2, metadata

from tunix_agentic.metrics.recorder import MetricsRecorder

_PCT = r"/p(50|95|99)$"

# (category, ((chart title, (tag regex, ...)), ...)), in the order the UI shows them.
RUN_LAYOUT: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    (
        "Reward and success",
        (
            ("reward per task", (r"^rollout/reward_mean(/.*)?$",)),
            ("success per task", (r"^rollout/success(/.*)?$",)),
            ("held-out success", (r"^eval/success(/.*)?$",)),
        ),
    ),
    (
        "Engine: busy / host gap / idle",
        (
            ("share of wall time since RL started", (r"^engine/\w+_fraction$",)),
            ("generated tokens per second", (r"^throughput/generated_tokens_per_\w+$",)),
        ),
    ),
    (
        "Seconds per RL step by stage",
        (
            ("RL step wall seconds", (r"^throughput/step_s$",)),
            ("episode stages (summed over episodes)", (r"^time/stage/\w+_s$",)),
            (
                "learner: wait for batch, train, weight sync",
                (r"^time/(wait_for_batch|train|weight_sync|eval)_s$",),
            ),
        ),
    ),
    (
        "Queue depths",
        (
            ("queues (last value)", (r"^gauge/queue/\w+(?<!_max)$",)),
            ("queues (max in the step)", (r"^gauge/queue/.*_max$",)),
            ("other gauges", (r"^gauge/(?!queue/).*$",)),
        ),
    ),
    (
        "Latency percentiles (seconds)",
        (
            ("episode: admission to reward", (r"^latency/episode" + _PCT,)),
            ("reward computation (EVAL)", (r"^latency/stage/eval" + _PCT,)),
            ("model call", (r"^latency/model_call" + _PCT,)),
            ("env step", (r"^latency/env_step" + _PCT,)),
            ("tool calls by tool", (r"^latency/tool/.+" + _PCT,)),
            ("environment start-up (env/<key>)", (r"^latency/env/.+" + _PCT,)),
            (
                "learner latency: wait for batch, train, weight sync",
                (r"^latency/(wait_for_batch|train|weight_sync)" + _PCT,),
            ),
            ("every span's p95", (r"^latency/.+/p95$",)),
        ),
    ),
)


def run_layout() -> layout_pb2.Layout:
    """:data:`RUN_LAYOUT` as the custom-scalars plugin's ``Layout`` proto."""
    return layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title=title,
                chart=[
                    layout_pb2.Chart(
                        title=chart, multiline=layout_pb2.MultilineChartContent(tag=list(tags))
                    )
                    for chart, tags in charts
                ],
            )
            for title, charts in RUN_LAYOUT
        ]
    )


def layout_summary_value(layout: layout_pb2.Layout) -> summary_pb2.Summary.Value:
    """The summary value the custom-scalars plugin reads: the serialized layout as a scalar
    string tensor under ``custom_scalars__config__``, tagged with the plugin's name."""
    if not isinstance(layout, layout_pb2.Layout):
        raise TypeError(f"layout must be a custom_scalar layout_pb2.Layout, got {type(layout)}")
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),  # a scalar
        string_val=[layout.SerializeToString()],
    )
    return summary_pb2.Summary.Value(
        tag=metadata.CONFIG_SUMMARY_TAG,
        metadata=metadata.create_summary_metadata(),
        tensor=tensor,
    )


def write_layout(recorder: MetricsRecorder, layout: layout_pb2.Layout | None = None) -> None:
    """Write ``layout`` (default :func:`run_layout`) into ``recorder``'s event file at step 0.

    A run resumed into the same directory writes it again; TensorBoard reads one of the
    (identical) copies.
    """
    recorder.write_summaries([layout_summary_value(layout or run_layout())], step=0)
