"""TRL's colocate path on vLLM's own engine: two training steps of the tiny policies, the engine's
weights equal to the trainer's after a sync (and not before it: the check can fail), and each
rollout's judge call started while the engine was still generating, seen from time stamps."""

from __future__ import annotations

import functools
import time

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from engine_kit import StampedJudge, free_engine, small_engine_args  # noqa: E402
from train_testkit import tiny_recipe_dict  # noqa: E402

from balcaprl.recipe import recipe_from_dict  # noqa: E402
from balcaprl.train.metrics import read_jsonl  # noqa: E402
from balcaprl.train.rollout_engine import vllm_param_name  # noqa: E402

# vLLM fuses some of the trainer's projections into one parameter (rows stacked in this order).
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
LEVELS = {"model", "language_model"}  # where the trainer and vLLM nest the same modules differently


def _key(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in LEVELS)


def engine_vs_trainer(llm, model) -> dict[str, float]:
    """Largest |engine - trainer| of every engine parameter, its trainer source found by name (vLLM's
    fused projections from the trainer's parts). A parameter without a source fails the test."""
    trainer = {_key(vllm_param_name(name)): p.detach() for name, p in model.named_parameters()}
    engine = llm.llm_engine.model_executor.driver_worker.model_runner.model
    gaps = {}
    for name, param in engine.named_parameters():
        key = _key(name)
        parts = None
        for fused, sources in FUSED.items():
            if f".{fused}." in key:
                parts = [key.replace(f".{fused}.", f".{source}.") for source in sources]
        source = torch.cat([trainer[p] for p in parts]) if parts else trainer.get(key)
        if source is None and key.endswith("lm_head.weight"):  # tied to the embeddings
            source = trainer.get(key.replace("lm_head", "embed_tokens"))
        assert source is not None, f"engine parameter {name} has no trainer source"
        value = param.data
        if value.shape[1:] == source.shape[1:] and value.shape[0] > source.shape[0]:
            value = value[: source.shape[0]]  # vLLM pads the vocabulary rows to a multiple of 64
        gaps[name] = float((value.float() - source.float()).abs().max())
    return gaps


def _train(policy, dataset, out, judge, monkeypatch):
    """Two steps of `balcaprl train`'s trainer with a colocated engine (test-sized: eager, small cache)."""
    from trl.generation import vllm_generation

    from balcaprl.train import build_trainer

    monkeypatch.setattr(vllm_generation, "LLM", functools.partial(vllm_generation.LLM, **small_engine_args()))
    recipe = recipe_from_dict(
        tiny_recipe_dict(
            policy,
            dataset,
            out,
            rollout={"vllm": {"mode": "colocate"}, "max_caption_tokens": 24, "temperature": 1.5},
            train={"max_steps": 2, "use_cpu": False, "judge_overlap": "per_rollout", "learning_rate": 1e-2},
        )
    )
    trainer = build_trainer(recipe, judge)
    generated: list[tuple[float, float]] = []  # (start, end) of each engine generate call
    llm = trainer.vllm_generation.llm
    generate = llm.generate

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            generated.append((start, time.perf_counter()))

    monkeypatch.setattr(llm, "generate", timed)
    trainer.train()
    return trainer, generated


@pytest.fixture(scope="module", params=["tiny_qwen2_5_vl", "tiny_llava"])
def trained(request, tiny_dataset, tmp_path_factory):
    judge = StampedJudge()
    with pytest.MonkeyPatch.context() as monkeypatch:
        policy = request.getfixturevalue(request.param)
        out = tmp_path_factory.mktemp("colocate")
        trainer, generated = _train(policy, tiny_dataset, out, judge, monkeypatch)
        state = {"trainer": trainer, "judge": judge, "generated": generated, "out": out}
        yield state
        # the engine must be gone before the next one starts: its finaliser tears down vLLM's groups
        state.clear()
        del trainer
    free_engine()


def test_two_steps_train_and_the_engine_holds_the_trainers_weights_after_a_sync(trained):
    trainer = trained["trainer"]
    assert trainer.state.global_step == 2 and len(trained["generated"]) == 2
    llm, model = trainer.vllm_generation.llm, trainer.accelerator.unwrap_model(trainer.model)
    # the engine was built with balcaprl's arguments (through TRL's module global: trl_seams.py)
    config = llm.llm_engine.model_config
    assert config.dtype == torch.float32  # the recipe's fp32, not the checkpoint's or TRL's default
    assert [config.multimodal_config.get_limit_per_prompt(m) for m in ("image", "video")] == [1, 0]
    before = engine_vs_trainer(llm, model)  # the engine holds step 1's weights, the trainer step 2's
    assert max(before.values()) > 1e-4, "training did not move the weights: the check below cannot fail"
    trainer.vllm_generation.sync_weights()
    after = engine_vs_trainer(llm, model)
    assert max(after.values()) == 0.0, {k: v for k, v in after.items() if v}  # fp32 engine: exact


def test_judging_starts_while_the_engine_is_still_generating(trained):
    arrived, generated = trained["judge"].arrived, trained["generated"]
    assert len(arrived) == 2 * 8  # 2 steps x 2 prompts x 4 rollouts, each judged once
    during = [t for t in arrived if any(start < t < end for start, end in generated)]
    assert during, f"no judge call started during generation: {arrived} vs {generated}"
    shares = [row["judge/started_early_share"] for row in read_jsonl(trained["out"] / "metrics.jsonl")
              if "judge/started_early_share" in row]  # fmt: skip
    assert len(shares) == 2 and all(0 < share <= 1 for share in shares)


def test_every_private_name_the_backend_relies_on_exists_in_the_installed_libraries(trained):
    """The one list (train/trl_seams.py) against the installed TRL, transformers and vLLM, instance
    attributes on the trained trainer; the runs above used them (judging during generation is the
    engine's add_request/step wrapped; the exact sync is _fix_param_name_to_vllm for LLaVA)."""
    from balcaprl.train.trl_seams import PRIVATE_NAMES, PrivateName, missing

    assert missing(trained["trainer"]) == []
    assert {entry.owner.split(":")[0].split(".")[0] for entry in PRIVATE_NAMES} == {"trl", "vllm"}
    moved = PrivateName("vllm.v1.engine.llm_engine:LLMEngine", "step_v2", "a renamed method")
    assert missing(trained["trainer"], (moved,)) == ["vllm.v1.engine.llm_engine:LLMEngine.step_v2"]
