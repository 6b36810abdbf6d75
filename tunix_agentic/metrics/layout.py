"""The custom-scalars layout every run writes: what TensorBoard shows first.

TensorBoard's scalars dashboard lists a run's ~100 tags alphabetically; the
custom-scalars dashboard ("CUSTOM SCALARS") instead opens on the categories
below, each a few charts whose lines are picked by regular expressions (a
chart draws every tag the regex matches in full), so per-task, per-tool and
per-env names need no listing:

* **Reward and success**: reward and success per task (training batches) and
  held-out success and reward.
* **Engine: busy / host gap / idle**: the engine's wall time split three ways,
  and generated tokens per wall second and per accelerator second.
* **Seconds per RL step by stage**: the step's wall time beside the learner's
  parts (wait for batch, train, weight sync, evaluation), and the episode stages
  (INIT / RUN / EVAL).
* **Queue depths**: episodes waiting for each stage's worker pool (INIT / RUN /
  EVAL) and running in it, groups ready and in flight, other gauges.
* **Latency percentiles**: p50 / p95 / p99 of whole episodes (admission to
  reward), the reward (EVAL), model calls, env steps, tool calls by tool and
  environment start-up (``env/<key>``, e.g. a sandbox's start).

The layout is one ``custom_scalars__config__`` tensor event written with
TensorBoard's own protos (no TensorFlow); see :func:`write_layout`. The
custom-scalars charts draw lines, not stacked areas.

TensorBoard scales a chart's y axis to the values between their 5th and 95th
percentiles by default ("Ignore outliers in chart scaling"): a chart of one
line with two distinct values keeps neither and draws nothing visible (an empty
axis from 0 to 1). So no chart is a lone line that a short run writes twice
(the RL step's wall time, held-out success before and after RL): each shares
its chart with related lines. :func:`visible_range` computes that axis range.

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
* rollout queue depth per stage: ``gauge/queue/<stage>_waiting`` (episodes waiting
  for a worker of stage ``init``, ``run`` or ``eval``: ``rollout.<stage>_workers``)
  and ``gauge/queue/<stage>_running`` (episodes holding one); groups:
  ``gauge/queue/ready_groups``, ``gauge/queue/in_flight_groups`` (each gauge with
  ``..._max``, its highest value within the step);
* tokens per accelerator-second: ``throughput/generated_tokens_per_accelerator_s``
  (tokens the engines generated since RL started / their busy seconds since then), beside
  ``throughput/generated_tokens_per_s`` (the batch's tokens / the step's wall time).
"""

from __future__ import annotations

import numpy as np
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
            # With reward beside it: a run evaluates twice by default, and two points alone
            # draw nothing under TensorBoard's outlier trimming (see the module docstring).
            ("held-out success and reward", (r"^eval/(success|reward)(/.*)?$",)),
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
            (
                "RL step wall seconds and the learner's parts",
                (r"^(throughput/step_s|time/(wait_for_batch|train|weight_sync|eval)_s)$",),
            ),
            ("episode stages (summed over episodes)", (r"^time/stage/\w+_s$",)),
        ),
    ),
    (
        "Queue depths",
        (
            (
                "episodes waiting for a stage's workers (max in the step)",
                (r"^gauge/queue/(init|run|eval)_waiting_max$",),
            ),
            (
                "episodes waiting for a stage's workers (last value)",
                (r"^gauge/queue/(init|run|eval)_waiting$",),
            ),
            (
                "episodes in a stage's workers (INIT / RUN / EVAL)",
                (r"^gauge/queue/(init|run|eval)_running(_max)?$",),
            ),
            ("groups ready and in flight", (r"^gauge/queue/\w+_groups(_max)?$",)),
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


def visible_range(values: list[float]) -> tuple[float, float] | None:
    """The y range TensorBoard's line chart scales to with its default "Ignore outliers
    in chart scaling": the extent of the finite ``values`` between their 5th and 95th
    percentiles (linear interpolation, as d3's quantile), or ``None`` when none is left
    (the chart then shows an empty 0-1 axis)."""
    x = np.sort(np.asarray([v for v in values if np.isfinite(v)], np.float64))
    if not x.size:
        return None
    lo, hi = np.quantile(x, 0.05), np.quantile(x, 0.95)
    kept = x[(x >= lo) & (x <= hi)]
    return (float(kept[0]), float(kept[-1])) if kept.size else None
