"""Judging overlapped with generation on the TRL backend (``balcaprl.train.judge_overlap``).

The tiny policy on CPU, trained twice from the same seed: with the judge's calls started as soon as
the captions exist and without. Same captions, same calls, same rewards, same advantages; with
overlap the calls start before TRL calls the reward functions; both runs log the judge's share of
the step (``judge/wall_s``, ``judge/exposed_s``). Then TRL's colocate path with the stand-in vLLM
engine (tests/train/fake_vllm.py), which finishes requests one by one, shortest first: with
``per_rollout`` each rollout's call starts while the engine still has rollouts running, in the order
the engine finished them, and the rewards and advantages are those of ``off``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
import torch
from fake_vllm import ScriptedServerClient, stand_in_vllm
from train_testkit import ScriptedJudge, run_on_two_processes, tiny_recipe_dict

from balcaprl.judge.protocol import JudgeRequest
from balcaprl.recipe import recipe_from_dict
from balcaprl.train.early_judge import EarlyJudge, judge_stage_metrics, stamped
from balcaprl.train.judge_overlap import watching_finishes
from balcaprl.train.metrics import read_jsonl

SERVER_WORKER = Path(__file__).with_name("judge_overlap_server_worker.py")


class WhenCalledJudge(ScriptedJudge):
    """Records, per judge_batch call, whether TRL was inside its reward step when it came."""

    def __init__(self):
        super().__init__(fail_every=3)
        self.in_reward_step = threading.Event()
        self.called_in_reward_step: list[bool] = []

    async def judge_batch(self, requests):
        self.called_in_reward_step.append(self.in_reward_step.is_set())
        return await super().judge_batch(requests)


async def _loop_barrier() -> None:
    for _ in range(3):  # each pass runs every callback and task step queued before it
        await asyncio.sleep(0)


def _run(tiny_policy, tiny_dataset, out, overlap, judge=None, **sections):
    from balcaprl.train import build_trainer

    judge = judge or WhenCalledJudge()
    train = {"judge_overlap": overlap, **sections.pop("train", {})}
    recipe = recipe_from_dict(tiny_recipe_dict(tiny_policy, tiny_dataset, out, train=train, **sections))
    trainer = build_trainer(recipe, judge)
    batches = []
    score, rewards_step = trainer._generate_and_score_completions, trainer._calculate_rewards

    def recording(inputs):
        output = score(inputs)
        batches.append(
            {
                "captions": [r.caption for r in trainer.scorer.last_batch.rollouts],
                "rewards": trainer._gathered_rewards.clone(),
                "advantages": output["advantages"].clone(),
            }
        )
        return output

    def in_reward_step(*args, **kwargs):
        # Calls started before the reward step are tasks queued on the reward loop; let the loop run
        # what is queued so far (a barrier, not a sleep), so that "started" is seen however loaded the
        # machine is, and anything the reward step itself starts still counts as started in it.
        asyncio.run_coroutine_threadsafe(_loop_barrier(), trainer.async_loop).result()
        judge.in_reward_step.set()
        try:
            return rewards_step(*args, **kwargs)
        finally:
            judge.in_reward_step.clear()

    trainer._generate_and_score_completions = recording
    trainer._calculate_rewards = in_reward_step
    trainer.train()
    return {"judge": judge, "trainer": trainer, "batches": batches, "out": out}


@pytest.fixture(scope="module")
def runs(tiny_policy, tiny_dataset, tmp_path_factory):
    return {
        overlap: _run(tiny_policy, tiny_dataset, tmp_path_factory.mktemp(f"overlap-{overlap}"), overlap)
        for overlap in (True, False)
    }


def test_the_former_boolean_still_reads(tiny_policy, tiny_dataset, tmp_path):
    def mode(value):
        return recipe_from_dict(
            tiny_recipe_dict(tiny_policy, tiny_dataset, tmp_path, train={"judge_overlap": value})
        ).train.judge_overlap

    assert (mode(True), mode(False), mode("batch")) == ("per_rollout", "off", "batch")
    with pytest.raises(ValueError, match="judge_overlap"):
        mode("sometimes")


def test_overlap_starts_the_calls_before_the_reward_step(runs):
    assert isinstance(runs[True]["trainer"].scorer.judge, EarlyJudge)
    assert runs[True]["judge"].called_in_reward_step == [False, False, False]
    assert runs[False]["judge"].called_in_reward_step == [True, True, True]


def test_same_calls_rewards_and_advantages_with_and_without_overlap(runs):
    on, off = runs[True], runs[False]
    assert on["judge"].calls == off["judge"].calls == 3  # one batch of calls per step, none twice
    assert [r.caption for r in on["judge"].requests] == [r.caption for r in off["judge"].requests]
    assert len(on["batches"]) == len(off["batches"]) == 3
    for a, b in zip(on["batches"], off["batches"], strict=True):
        assert a["captions"] == b["captions"]
        assert torch.equal(a["rewards"].nan_to_num(-1.0), b["rewards"].nan_to_num(-1.0))
        assert torch.equal(a["advantages"], b["advantages"])
    assert any(torch.isnan(a["rewards"]).any() for a in on["batches"])  # failures (NaN) travel alike


def test_usage_is_counted_in_the_step_that_used_the_calls(runs):
    for overlap in (True, False):
        steps = [r for r in read_jsonl(runs[overlap]["out"] / "metrics.jsonl") if r["kind"] == "step"]
        tokens = [s["judge/usage/prompt_tokens"] for s in steps]
        assert all(t > 0 for t in tokens), (overlap, tokens)
    on = [r for r in read_jsonl(runs[True]["out"] / "metrics.jsonl") if r["kind"] == "step"]
    off = [r for r in read_jsonl(runs[False]["out"] / "metrics.jsonl") if r["kind"] == "step"]
    assert [s["judge/usage/prompt_tokens"] for s in on] == [s["judge/usage/prompt_tokens"] for s in off]


def test_both_schedules_log_the_judges_share_of_the_step(runs):
    for overlap in (True, False):
        steps = [r for r in read_jsonl(runs[overlap]["out"] / "metrics.jsonl") if r["kind"] == "step"]
        for step in steps:
            assert 0 <= step["judge/exposed_s"] <= step["judge/wall_s"]


# ---------------------------------------------------------------------------------- EarlyJudge alone


def _requests(*captions: str) -> list[JudgeRequest]:
    return [JudgeRequest(image=f"/img/{c}.png", caption=c, reference="a red door") for c in captions]


def test_early_judge_answers_started_requests_and_judges_the_rest():
    inner = ScriptedJudge(fail_every=None, check_images=False)

    async def go():
        early = EarlyJudge(inner, asyncio.get_running_loop())
        early.start(_requests("a red door", "a door"))
        await asyncio.sleep(0)  # the loop launches the started batch
        await asyncio.sleep(0)
        assert inner.calls == 1
        outcomes, usage = await early.judge_batch_counted(_requests("a door", "blue", "a red door"))
        return early, outcomes, usage

    early, outcomes, usage = asyncio.run(go())
    assert inner.calls == 2  # the started batch, then "blue" alone
    assert [len(r.caption) for r in inner.requests] == [len("a red door"), len("a door"), len("blue")]
    by_caption = {o.verdict.caption_assertions[0].text: o for o in outcomes}
    assert set(by_caption) == {"a", "blue"}  # in the order asked: "a door", "blue", "a red door"
    assert [o.verdict.caption_assertions[-1].text for o in outcomes] == ["door", "blue", "door"]
    assert usage["prompt_tokens"] == inner.usage()["prompt_tokens"]  # both batches, once, with the batch
    assert early.forget_started() == 0


def test_a_request_started_twice_is_answered_twice_and_unused_ones_are_dropped():
    inner = ScriptedJudge(fail_every=None, check_images=False)

    async def go():
        early = EarlyJudge(inner, asyncio.get_running_loop())
        early.start(_requests("x", "x", "y"))
        first = await early.judge_batch(_requests("x"))
        return early, first

    early, first = asyncio.run(go())
    assert len(first) == 1 and inner.calls == 1
    assert early.forget_started() == 2  # the second "x" and "y" were never asked for


def test_a_request_that_is_no_valid_unicode_is_never_sent_early():
    # judge_rollouts refuses such a rollout (tests/train/test_train_rewards.py) and never asks for it:
    # the call started early for it must not be made either
    inner = ScriptedJudge(fail_every=None, check_images=False)

    async def go():
        early = EarlyJudge(inner, asyncio.get_running_loop())
        early.start(_requests("a red \ud800door", "a door"))
        early.start(_requests("x\udfff"))
        await _loop_barrier()
        return early, await early.judge_batch(_requests("a door"))

    early, (outcome,) = asyncio.run(go())
    assert inner.calls == 1 and [r.caption for r in inner.requests] == ["a door"]
    assert outcome.verdict.caption_assertions[-1].text == "door"
    assert early.forget_started() == 2  # the two refused ones, never asked for


def test_stage_metrics_from_stamps_by_hand():
    rows = [
        {"judge_started_s": 10.0, "judge_finished_s": 12.0},
        {"judge_started_s": 11.0, "judge_finished_s": 15.0},
        {"judge_started_s": 14.0, "judge_finished_s": 14.5},
        {"judge_started_s": float("nan"), "judge_finished_s": float("nan")},  # not stamped
        {},
    ]
    assert judge_stage_metrics(rows) == {"judge/wall_s": 5.0, "judge/exposed_s": 1.0}
    assert judge_stage_metrics([{}]) == {}
    result = stamped({"score": 1.0}, started=5.0)
    assert result["judge_started_s"] == 5.0 and result["judge_finished_s"] >= 5.0


# ------------------------------------------------------------- each rollout judged as vLLM finishes it


@pytest.fixture(scope="module")
def colocated(tiny_policy, tiny_dataset, tmp_path_factory):
    """Two steps of TRL's colocate path on the stand-in engine, per_rollout and off; for per_rollout,
    each start of rollouts' calls with how many requests the engine still had unfinished then."""
    runs = {}
    for mode in ("per_rollout", "off"):
        with pytest.MonkeyPatch.context() as monkeypatch:
            engines = stand_in_vllm(monkeypatch)
            started: list[tuple[list[int], int]] = []

            def recording(self, by_index, start=EarlyJudge.start_rollouts, engines=engines, started=started):
                started.append(
                    (sorted(by_index), engines.instances[0].llm_engine.get_num_unfinished_requests())
                )
                return start(self, by_index)

            monkeypatch.setattr(EarlyJudge, "start_rollouts", recording)
            run = _run(
                tiny_policy,
                tiny_dataset,
                tmp_path_factory.mktemp(f"colocated-{mode}"),
                mode,
                rollout={"vllm": {"mode": "colocate"}},
                train={"use_cpu": False, "max_steps": 2, "prompts_per_batch": 2},
            )
            run["engine"], run["started"] = engines.instances[0].llm_engine, started
            runs[mode] = run
    return runs


def test_each_rollout_is_judged_as_the_engine_finishes_it(colocated):
    run = colocated["per_rollout"]
    engine, judge = run["engine"], run["judge"]
    rollouts = len(engine.finished)
    assert rollouts == 16  # 2 steps x 2 prompts x 4 rollouts, one request each (n=1 in colocate)
    assert [int(i) for i in engine.finished] != sorted(int(i) for i in engine.finished)  # not in added order
    # One call per rollout, started inside the engine step that finished it, while others still ran.
    assert len(run["started"]) == rollouts == judge.calls
    assert not any(judge.called_in_reward_step)
    assert [unfinished for _, unfinished in run["started"]] == [7, 6, 5, 4, 3, 2, 1, 0] * 2
    # The calls reached the judge in the engine's finish order: rollout i of a step is request id i.
    finish_order = [int(i) % 8 for i in engine.finished]
    assert [index for (index,), _ in run["started"]] == finish_order
    captions = [caption for batch in run["batches"] for caption in batch["captions"]]  # request id order
    assert [r.caption for r in judge.requests] == [captions[int(i)] for i in engine.finished]


def test_per_rollout_gives_the_rewards_and_advantages_of_no_overlap(colocated):
    on, off = colocated["per_rollout"], colocated["off"]
    assert off["judge"].calls == 2  # one batch a step without overlap
    assert sorted(r.caption for r in on["judge"].requests) == sorted(r.caption for r in off["judge"].requests)
    assert on["engine"].finished == off["engine"].finished  # the same engine run
    for a, b in zip(on["batches"], off["batches"], strict=True):
        assert a["captions"] == b["captions"]
        assert torch.equal(a["rewards"].nan_to_num(-1.0), b["rewards"].nan_to_num(-1.0))
        assert torch.equal(a["advantages"], b["advantages"])
    assert any(torch.isnan(a["rewards"]).any() for a in on["batches"])  # failures travel alike
    assert on["trainer"].scorer.judge.mismatched == 0
    # the end of generation -> rewards asked for, learned in TRL's step: the judge's deadline next step
    assert on["trainer"].scorer.judge.lead_s >= 0.0
    usage = {
        mode: [
            r["judge/usage/prompt_tokens"]
            for r in read_jsonl(run["out"] / "metrics.jsonl")
            if r["kind"] == "step"
        ]
        for mode, run in colocated.items()
    }
    assert usage["per_rollout"] == usage["off"] and all(t > 0 for t in usage["off"])


def test_watching_finishes_numbers_requests_by_the_order_they_were_added():
    """vLLM's engine surface by hand: ids from a counter that does not start at 0, outputs that are not
    finished, and an id the wrapper never saw added."""
    from types import SimpleNamespace

    class Engine:
        def __init__(self):
            self.pending = []

        def add_request(self, request_id, prompt, params=None):
            self.pending.append(request_id)

        def step(self):
            request_id = self.pending.pop()  # last added finishes first
            return [
                SimpleNamespace(request_id=request_id, finished=True),
                SimpleNamespace(request_id="x", finished=True),  # not added during this call
                SimpleNamespace(request_id=request_id, finished=False),
            ]

    engine, seen = Engine(), []
    with watching_finishes(engine, seen.append):
        for request_id in ("17", "18", "19"):
            engine.add_request(request_id, prompt=None)
        while engine.pending:
            engine.step()
    assert [[index for index, _ in step] for step in seen] == [[2], [1], [0]]
    assert "add_request" not in vars(engine) and "step" not in vars(engine)  # the class's methods again


def test_settle_keeps_early_calls_by_index_and_judges_a_mismatch_once_more():
    inner = ScriptedJudge(fail_every=None, check_images=False)

    async def go():
        early = EarlyJudge(inner, asyncio.get_running_loop())
        early.start_rollouts({1: _requests("b")[0], 0: _requests("a")[0], 2: _requests("stale")[0]})
        early.settle(_requests("a", "b", "c"))  # rollout 2 decoded otherwise; rollout 3 never started
        assert early.mismatched == 1
        outcomes = await early.judge_batch(_requests("a", "b", "c"))
        return early, outcomes

    early, outcomes = asyncio.run(go())
    assert [o.verdict.caption_assertions[0].text for o in outcomes] == ["a", "b", "c"]
    assert [r.caption for r in inner.requests] == ["b", "a", "stale", "c"]  # one call each, "c" after settle
    assert early.forget_started() == 0


# ------------------------------------------------------------------ server mode: per-prompt responses


def test_server_mode_judges_each_prompts_rollouts_as_its_response_arrives(tiny_policy):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from balcaprl.train.judge_overlap import TrlJudgeOverlap
    from balcaprl.train.rewards import SharedVerdictScorer

    processor = AutoTokenizer.from_pretrained(tiny_policy)  # what the processor's batch_decode uses
    vocab = [i for i in range(len(processor)) if i not in processor.all_special_ids]
    prompts, n = 3, 2
    client = ScriptedServerClient(prompts, vocab, released_by_caller=True)
    started: list[dict[int, JudgeRequest]] = []

    def start_rollouts(by_index):  # prompt j's rollouts seen: the server may answer prompt j - 1
        started.append(by_index)
        client.release(min(by_index) // n)

    trainer = SimpleNamespace(
        use_vllm=True,
        vllm_mode="server",
        vllm_generation=SimpleNamespace(vllm_client=client),
        accelerator=SimpleNamespace(is_main_process=True, num_processes=1, process_index=0),
        num_generations=n,
        processing_class=processor,
        scorer=SharedVerdictScorer(ScriptedJudge(), image_column="image", reference_column="reference"),
    )
    inputs = [{"image": f"/img/{i // n}.png", "reference": "a red door", "reference_tokens": 3}
              for i in range(prompts * n)]  # fmt: skip
    chat = [[{"role": "user", "content": "describe"}]] * len(inputs)
    prompt_ids = [[j, 7, 7] for j in range(prompts)]
    overlap = TrlJudgeOverlap(trainer, "off")  # no reward loop here: the early judge is a recorder
    overlap.begin_batch(inputs)
    overlap.mode, overlap.early_judge = "per_rollout", SimpleNamespace(start_rollouts=start_rollouts)
    with overlap.watching(chat):
        output = client._generate_from_features(prompt_ids, [None] * prompts, {"n": n})
    assert client.order == [2, 1, 0]
    assert "_post" not in vars(client) and "_generate_from_features" not in vars(client)
    # One start per response, its rollouts at j*n+k, captions as TRL decodes the returned ids.
    assert [sorted(batch) for batch in started] == [[4, 5], [2, 3], [0, 1]]
    decoded = processor.batch_decode(output["completion_ids"], skip_special_tokens=True)
    by_index = {i: request for batch in started for i, request in batch.items()}
    assert [by_index[i].caption for i in range(len(inputs))] == [text.strip() for text in decoded]
    assert [by_index[i].image for i in range(len(inputs))] == [row["image"] for row in inputs]


# ------------------------------------------------ server mode, two processes: the main one judges all


@pytest.fixture(scope="module")
def two_processes(tiny_policy, tmp_path_factory):
    """TRL's server-mode generation on two processes (torchrun, gloo) with the judge overlap around it
    (judge_overlap_server_worker.py): for each case and mode, what each process saw."""
    out = tmp_path_factory.mktemp("server-two-processes")
    run_on_two_processes(SERVER_WORKER, tiny_policy, out)
    return {
        (case, mode): [json.loads((out / case / mode / f"rank{r}.json").read_text()) for r in (0, 1)]
        for case in ("whole_groups", "split_groups")
        for mode in ("per_rollout", "off")
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", ["whole_groups", "split_groups"])
def test_every_processs_rollouts_are_judged_while_the_server_generates(two_processes, case):
    main, other = two_processes[case, "per_rollout"]
    size = len(main["captions"])
    assert len(other["captions"]) == size
    # Every rollout of both processes was handed to the judge, on the main process, before TRL's
    # generate returned on either process (they return after the broadcast of the last response).
    places = {f"{process}/{index}" for process in (0, 1) for index in range(size)}
    assert set(main["submitted"]) == places and other["submitted"] == {}
    assert main["returned_everywhere"] == [main["returned"], other["returned"]]
    assert max(main["submitted"].values()) < min(main["returned"], other["returned"])
    # The main process judged every rollout, in one call each; the other judged none itself.
    assert sorted(main["judged_here"]) == sorted(main["captions"] + other["captions"])
    assert other["judged_here"] == []
    for process in (main, other):
        assert process["metrics"]["judge/started_early_share"] == 1.0 and process["mismatched"] == 0
        assert process["metrics"]["judge/exposed_s"] <= process["metrics"]["judge/wall_s"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["whole_groups", "split_groups"])
def test_each_process_gets_the_rewards_of_its_own_rollouts(two_processes, case):
    on, off = two_processes[case, "per_rollout"], two_processes[case, "off"]
    for rank in (0, 1):
        assert on[rank]["captions"] == off[rank]["captions"]  # the same server answers, sliced alike
        assert on[rank]["rewards"] == off[rank]["rewards"]  # exactly: the verdicts travel unchanged
        assert off[rank]["judged_here"] == off[rank]["captions"]  # off: each process judges its own
    rewards = [row for rank in (0, 1) for row in on[rank]["rewards"]]
    assert [None] * 3 in rewards  # a failed call travels as a failure, never a 0
    assert len({tuple(row) for row in rewards}) > 2  # the rows' rewards differ: a swap would show
    assert on[0]["captions"] != on[1]["captions"]
    # Usage: the main process paid for every call, counted once over the processes.
    assert on[1]["usage"] == {} and on[0]["usage"]["prompt_tokens"] > 0
    total = sum(off[rank]["usage"]["prompt_tokens"] for rank in (0, 1))
    assert on[0]["usage"]["prompt_tokens"] == total


class InterleavingJudge(ScriptedJudge):
    """Counts a batch's usage, then yields to the loop before answering: concurrent batches interleave."""

    async def judge_batch(self, requests):
        outcomes = await super().judge_batch(requests)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return outcomes


def test_usage_of_overlapping_rollout_batches_is_counted_once():
    inner = InterleavingJudge(fail_every=None, check_images=False)
    captions = ["a red door", "a door", "blue", "a cat on a mat"]

    async def go():
        early = EarlyJudge(inner, asyncio.get_running_loop())
        for index, caption in enumerate(captions):  # one batch per finished rollout, all in flight at once
            early.start_rollouts({index: _requests(caption)[0]})
        early.settle(_requests(*captions))
        _, usage = await early.judge_batch_counted(_requests(*captions))
        return early, usage

    early, usage = asyncio.run(go())
    assert inner.calls == 4 and early.started_early_share() == 1.0  # every rollout started before settle
    expected = sum(len(c.split()) + 3 for c in captions)  # caption words + the reference's 3
    assert usage["prompt_tokens"] == inner.usage()["prompt_tokens"] == expected
