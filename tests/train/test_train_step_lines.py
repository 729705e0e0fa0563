"""The training step lines in a log file: one line a step (never wrapped), elapsed time and ETA, and
the legend once at the start."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from balcaprl.train.metrics import STEP_LINE_LEGEND, RichProgressCallback


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_step_lines_are_whole_with_elapsed_and_eta_after_the_legend_once(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")  # rich wrapped at this width (80 by default) off a terminal
    clock, out = Clock(), io.StringIO()
    callback = RichProgressCallback(stream=out, terminal=False, heartbeat=False, clock=clock)
    state = SimpleNamespace(is_world_process_zero=True, max_steps=100, global_step=20)  # resumed at 20
    callback.on_train_begin(None, state, None)
    logs = {
        "rewards/precision/mean": 0.5123, "rewards/recall/mean": 0.43, "rewards/linguistic/mean": 0.8,
        "length/caption_tokens_mean": 48.2, "length/ratio_mean": 0.9712, "length/masked_share": 0.125,
        "judge/failures": 0, "loss": -6.37,
    }  # fmt: skip
    for step in (30, 40):
        clock.now += 20  # 10 steps in 20 s: 0.5 steps/s
        state.global_step = step
        callback.on_step_end(None, state, None)
        callback.on_log(None, state, None, logs=logs)
    callback.on_train_end(None, state, None)
    lines = out.getvalue().splitlines()
    assert lines[0] == "balcaprl train: started, 100 steps"
    assert lines[1 : 1 + len(STEP_LINE_LEGEND)] == list(STEP_LINE_LEGEND)
    steps = [line for line in lines if re.match(r"step +\d", line)]
    assert steps == [
        "step    30  P 0.512  R 0.430  L 0.800  len 48 tok (x0.97)  masked 12%  fail 0  loss -6.3700  "
        "elapsed 0:00:20, ETA 0:02:20",  # 70 steps to go at 0.5/s
        "step    40  P 0.512  R 0.430  L 0.800  len 48 tok (x0.97)  masked 12%  fail 0  loss -6.3700  "
        "elapsed 0:00:40, ETA 0:02:00",
    ]
    legend = " ".join(STEP_LINE_LEGEND)
    assert "(x0.97)" in legend and "loss" in legend and "negative" in legend
    assert out.getvalue().count(STEP_LINE_LEGEND[0]) == 1


def test_a_line_on_a_batch_already_judged_says_so():
    """updates_per_batch 2: every other step reuses the batch judged the step before and logs no
    rewards; its line names that step instead of a row of dashes."""
    out = io.StringIO()
    callback = RichProgressCallback(stream=out, terminal=False, heartbeat=False, clock=Clock())
    state = SimpleNamespace(is_world_process_zero=True, max_steps=4, global_step=0)
    callback.on_train_begin(None, state, None)
    for step, logs in ((1, {"rewards/precision/mean": 0.5, "loss": 0.25}), (2, {"loss": 0.125})):
        state.global_step = step
        callback.on_log(None, state, None, logs=logs)
    steps = [line for line in out.getvalue().splitlines() if re.match(r"step +\d", line)]
    assert steps[0].startswith("step     1  P 0.500  R -")
    assert steps[1].startswith("step     2  same batch as step 1 (update 2, no new rewards)  loss 0.1250  ")
    assert any("same batch as step N" in line for line in STEP_LINE_LEGEND)
