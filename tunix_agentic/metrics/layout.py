"""The custom-scalars layout every run writes: what TensorBoard shows first.

TensorBoard's scalars dashboard lists a run's tags alphabetically; the
custom-scalars dashboard ("CUSTOM SCALARS") instead opens on the categories
below, in the order a researcher reads them, each a few charts whose lines are
picked by regular expressions over the tags (a chart draws every tag the regex
matches in full, in every run):

* **Step time and throughput**: where each RL step's time went (generation,
  environment, reward, evaluation, waiting, train, weight sync, other, and the
  step's wall time), the engine's busy / host gap / idle share of the step,
  generated tokens per second of the step and of device calls, and the model FLOPs
  utilization of the train step and of decoding (:mod:`tunix_agentic.metrics.mfu`).
* **Reward and success**: per training batch and held out, each task a line.
* **Learner health**: loss, KL, entropy, gradient norm, clip fraction, response
  length (mean, max), truncation, staleness, filtered groups, peak memory.
* **Engine**: prefix-cache hits and KV occupancy.
* **Queues**: episodes waiting for and running in each stage's workers (INIT /
  RUN / EVAL, each a line), groups ready and in flight (max in the step).
* **Latency**: p50 / p95 / p99 (each a line, in ms) of episodes, the reward,
  model calls, env steps, tool calls and environment start-up, for the spans that
  ran several times in the step.

Every chart draws at most one tag of a run: a breakdown's series are runs of
their own (:mod:`tunix_agentic.metrics.series`), so TensorBoard gives each line its
own colour and names it in the legend. A run writes its layout after its first RL
step with the charts that have data by then (:func:`charts_with_data`), and a chart
whose data first appears later when it does (:class:`LayoutWriter`): a chart of
data the run does not write (no tool calls, no start-up reports) never appears
empty. The layout is one ``custom_scalars__config__`` tensor event written with
TensorBoard's own protos (no TensorFlow); see :func:`write_layout`.

TensorBoard scales a chart's y axis to the values between their 5th and 95th
percentiles by default ("Ignore outliers in chart scaling"): a chart of one
line with two distinct values keeps neither and draws nothing visible (an empty
axis from 0 to 1); :func:`visible_range` computes that axis range.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

import numpy as np
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.custom_scalar import layout_pb2, metadata

from tunix_agentic.metrics import series
from tunix_agentic.metrics.recorder import MetricsRecorder

# (category, ((chart title, (tag regex, ...)), ...)), in the order the UI shows them. A
# regex matches TensorBoard tags (see tunix_agentic.metrics.series): each chart draws at
# most one tag of each run, so its lines are runs, each its own colour.
RUN_LAYOUT: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    (
        "Step time and throughput",
        (
            (
                "where did step N's time go? (seconds by part, and the step)",
                (r"^step_time/(part|wall)_s$",),
            ),
            (
                "is the engine waiting? (share of its time in the step)",
                (r"^engine/time_fraction$",),
            ),
            ("generated tokens per second of the step", (r"^throughput/generated_tokens_per_s$",)),
            (
                "generated tokens per second of device calls",
                (r"^throughput/generated_tokens_per_accelerator_s$",),
            ),
            ("MFU of the train step (share of peak FLOP/s)", (r"^perf/mfu_train$",)),
            ("MFU of decoding (share of peak FLOP/s)", (r"^perf/mfu_decode$",)),
        ),
    ),
    (
        "Reward and success",
        (
            ("reward (training batches; each task a line)", (r"^rollout/reward_mean$",)),
            ("success (training batches; each task a line)", (r"^rollout/success_fraction$",)),
            ("held-out success (each task a line)", (r"^eval/success_fraction$",)),
            ("held-out reward (each task a line)", (r"^eval/reward_mean$",)),
        ),
    ),
    (
        "Learner health: is the policy collapsing?",
        (
            ("loss", (r"^learner/loss$",)),
            ("KL to the sampling policy (approx.)", (r"^learner/approx_kl_nats$",)),
            ("entropy (nats per token)", (r"^learner/entropy_nats$",)),
            ("gradient norm", (r"^learner/grad_norm$",)),
            ("clip fraction", (r"^learner/clip_fraction$",)),
            ("response length, mean (tokens)", (r"^rollout/response_tokens_mean$",)),
            ("response length, max (tokens)", (r"^rollout/response_tokens_max$",)),
            ("truncated at the token limit (share)", (r"^rollout/truncated_fraction$",)),
            (
                "staleness: policy lag of the trained tokens (versions)",
                (r"^rollout/staleness_versions_max$",),
            ),
            ("groups filtered (per step)", (r"^count/rollout/groups_filtered_per_step$",)),
            (
                "groups filtered in a row (longest streak)",
                (r"^gauge/rollout/filtered_streak_groups_max$",),
            ),
            ("peak memory (GiB)", (r"^perf/peak_\w+_memory_gib$",)),
        ),
    ),
    (
        "Engine",
        (
            (
                "prefix-cache hits (share of prompt tokens)",
                (r"^engine/prefix_cache_hit_fraction$",),
            ),
            ("KV occupancy (share held)", (r"^engine/kv_occupancy_fraction$",)),
        ),
    ),
    (
        "Queues (max in the step; each stage a line)",
        (
            ("episodes waiting for a stage's workers", (r"^gauge/queue/waiting_episodes_max$",)),
            ("episodes in a stage's workers", (r"^gauge/queue/running_episodes_max$",)),
            ("groups ready and in flight", (r"^gauge/queue/groups_max$",)),
        ),
    ),
    (
        "Latency (ms; p50 / p95 / p99 over the step)",
        (
            ("episode: admission to reward", (r"^latency/episode_ms$",)),
            ("reward computation (EVAL stage)", (r"^latency/stage/eval_ms$",)),
            ("model call", (r"^latency/model_call_ms$",)),
            ("env step", (r"^latency/env_step_ms$",)),
            ("tool calls (each tool a line per percentile)", (r"^latency/tool_ms$",)),
            ("environment start-up (env/<key>)", (r"^latency/env_start_ms$",)),
        ),
    ),
)


def charts_with_data(names: Iterable[str]) -> set[str]:
    """Titles of the :data:`RUN_LAYOUT` charts that draw one of the flat scalar ``names``."""
    tags = {series.place(n)[1] for n in names}
    return {
        chart
        for _, charts in RUN_LAYOUT
        for chart, regexes in charts
        if any(re.search(r, t) for r in regexes for t in tags)
    }


def run_layout(only: Collection[str] | None = None) -> layout_pb2.Layout:
    """:data:`RUN_LAYOUT` as the custom-scalars plugin's ``Layout`` proto; with ``only``,
    just those charts (and no category left without one)."""
    categories = []
    for title, charts in RUN_LAYOUT:
        kept = [
            layout_pb2.Chart(
                title=chart, multiline=layout_pb2.MultilineChartContent(tag=list(tags))
            )
            for chart, tags in charts
            if only is None or chart in only
        ]
        if kept:
            categories.append(layout_pb2.Category(title=title, chart=kept))
    return layout_pb2.Layout(category=categories)


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


def write_layout(
    recorder: MetricsRecorder, layout: layout_pb2.Layout | None = None, *, step: int = 0
) -> None:
    """Write ``layout`` (default: :func:`run_layout` with the charts that have data among
    what ``recorder`` wrote so far) into ``recorder``'s event file at ``step``.

    TensorBoard reads the first copy a run wrote (a resumed run writes it again).
    """
    if layout is None:
        layout = run_layout(only=charts_with_data(recorder.written_names()))
    recorder.write_summaries([layout_summary_value(layout)], step=step)


class LayoutWriter:
    """The run's layout, kept up with its data: after the first RL step the charts with
    data by then (:func:`write_layout`); after a later step, the charts whose data first
    appeared in it (a tool first called at step 30) as a layout of their own, in a run
    ``layout/<step>`` below the run's. TensorBoard reads only the first layout a run
    writes, and merges every run's into one dashboard: a late chart joins its category,
    after the charts already there."""

    def __init__(self) -> None:
        self._shown: set[str] | None = None

    def after_step(self, recorder: MetricsRecorder, step: int) -> None:
        charts = charts_with_data(recorder.written_names())
        if self._shown is None:
            write_layout(recorder, run_layout(only=charts), step=step)
            self._shown = charts
            return
        new = charts - self._shown
        if new:
            value = layout_summary_value(run_layout(only=new))
            recorder.write_summaries([value], step=step, run=f"layout/{step}")
            self._shown |= new


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
