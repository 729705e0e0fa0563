"""Checkpoints a run can trust: written aside and published in one rename, a save cut short leaves the
earlier ones as they were, --resume falls back to the newest complete one (one line per skipped
folder), and final/ is the whole model even when checkpoints are FSDP shards."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from train_testkit import ScriptedJudge, tiny_recipe_dict

from balcaprl.plan.memory import checkpoint_disk, launcher_from_accelerate, model_shape
from balcaprl.recipe import recipe_from_dict
from balcaprl.train import train
from balcaprl.train.checkpointing import (
    MANIFEST,
    STAGING_DIR,
    incomplete_reason,
    latest_checkpoint,
    publish,
    resolve_resume,
    save_final_model,
    write_manifest,
)

ROOT = Path(__file__).resolve().parents[2]


def checkpoint(
    folder: Path, step: int, *, state: bool = True, weights: str | None = "model.safetensors"
) -> Path:
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if weights == "pytorch_model_fsdp_0":  # FSDP SHARDED_STATE_DICT: a torch.distributed.checkpoint folder
        (path / weights).mkdir()
        (path / weights / "__0_0.distcp").write_bytes(b"shard")
        (path / "optimizer_0").mkdir()
    elif weights is not None:
        (path / weights).write_bytes(b"weights")
    write_manifest(path)  # what a save writes last
    return path


def test_resume_skips_incomplete_checkpoints_with_one_line_each(tmp_path):
    checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 4, weights="pytorch_model_fsdp_0")  # sharded: complete
    checkpoint(tmp_path, 6, state=False)  # cut short before trainer_state.json
    checkpoint(tmp_path, 8, weights=None)  # state but no weights
    (checkpoint(tmp_path, 10) / "trainer_state.json").write_text("{trunc")  # damaged
    lines: list[str] = []
    assert resolve_resume(tmp_path, True, report=lines.append) == tmp_path / "checkpoint-4"
    assert lines == [
        f"skipping {tmp_path / 'checkpoint-10'}: incomplete (trainer_state.json unreadable); "
        "resuming from an earlier checkpoint",
        f"skipping {tmp_path / 'checkpoint-8'}: incomplete (no model weights); resuming from an earlier checkpoint",
        f"skipping {tmp_path / 'checkpoint-6'}: incomplete (no trainer_state.json); resuming from an earlier checkpoint",
    ]
    assert all("\n" not in line for line in lines)
    with pytest.raises(ValueError, match="--resume-from .*checkpoint-8: an incomplete checkpoint"):
        resolve_resume(tmp_path, tmp_path / "checkpoint-8")
    only_broken = tmp_path / "broken"
    checkpoint(only_broken, 6, state=False)
    assert latest_checkpoint(only_broken) is None


def test_a_checkpoint_is_complete_only_when_its_files_match_its_manifest(tmp_path):
    """Hand-made damage, each of which a resume used to load (and die on): the manifest's sizes and
    hashes find every one, and the reason names the file."""
    damage = {
        "truncated": lambda c: os.truncate(c / "model.safetensors", 3),
        "cut in half": lambda c: os.truncate(c / "optimizer.pt", 4),
        "flipped byte": lambda c: (c / "model.safetensors").write_bytes(b"weighTs"),  # same size
        "deleted": lambda c: (c / "optimizer.pt").unlink(),
        "no manifest": lambda c: (c / MANIFEST).unlink(),
        "manifest garbage": lambda c: (c / MANIFEST).write_text("{"),
    }
    expected = {
        "truncated": "model.safetensors has 3 bytes, 7 were written",
        "cut in half": "optimizer.pt has 4 bytes, 8 were written",
        "flipped byte": "model.safetensors is not what was written (its hash differs)",
        "deleted": "optimizer.pt is missing",
        "no manifest": f"no {MANIFEST}: cut short, or saved before balcaprl checked its checkpoints",
        "manifest garbage": f"{MANIFEST} unreadable",
    }
    for name, spoil in damage.items():
        folder = tmp_path / name.replace(" ", "-")
        good = checkpoint(folder, 2)
        bad = folder / "checkpoint-4"
        shutil.copytree(good, bad)
        (bad / "optimizer.pt").write_bytes(b"moments!")
        write_manifest(bad)
        assert incomplete_reason(bad) is None
        spoil(bad)
        lines: list[str] = []
        assert latest_checkpoint(folder, report=lines.append) == good, name
        assert lines == [
            f"skipping {bad}: incomplete ({expected[name]}); resuming from an earlier checkpoint"
        ]


def test_publish_moves_a_finished_folder_in_one_rename(tmp_path):
    staged = checkpoint(tmp_path / STAGING_DIR, 4)
    target = tmp_path / "checkpoint-4"
    publish(staged, target)
    assert not staged.exists() and incomplete_reason(target) is None
    again = checkpoint(tmp_path / STAGING_DIR, 4, weights="adapter_model.safetensors")  # saved again
    publish(again, target)
    assert sorted(p.name for p in target.iterdir()) == [
        "adapter_model.safetensors",
        MANIFEST,
        "trainer_state.json",
    ]
    assert sorted(p.name for p in (tmp_path / STAGING_DIR).iterdir()) == []  # the old copy is gone


def test_a_save_cut_short_keeps_the_earlier_checkpoints_and_resume_falls_back(
    tiny_policy, tiny_dataset, tmp_path, monkeypatch, capsys
):
    from transformers import Trainer

    out = tmp_path / "run"
    recipe = recipe_from_dict(
        tiny_recipe_dict(tiny_policy, tiny_dataset, out, data={"max_samples": 4}, run={"save_total_limit": 1})
    )
    real = Trainer._save_rng_state

    def disk_full_at_step_2(self, output_dir):
        if self.state.global_step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", disk_full_at_step_2)
    with pytest.raises(OSError, match="No space left"):
        train(recipe, ScriptedJudge())
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]  # 2 never published
    assert incomplete_reason(out / "checkpoint-1") is None
    assert (out / STAGING_DIR / "checkpoint-2").is_dir()  # the half-written one stays aside

    monkeypatch.setattr(Trainer, "_save_rng_state", real)
    capsys.readouterr()
    resumed = train(recipe, ScriptedJudge(), resume=True)
    assert resumed.resumed_from == out / "checkpoint-1" and resumed.global_step == 3
    # save_total_limit 1: only the newest checkpoint is kept, and final/ is the whole policy.
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    assert (out / "final" / "model.safetensors").is_file()
    assert not (out / STAGING_DIR / "final").exists()
    for folder in (out / "checkpoint-3", out / "final"):  # the trainer's own saves
        assert _video_processor(folder)["video_processor_type"] == "Qwen2VLVideoProcessor", folder


def _video_processor(folder: Path) -> dict:
    """The video processor settings transformers finds in ``folder`` (the first step of loading the full
    Qwen2/2.5-VL processor class, which vLLM does; the rest needs torchvision)."""
    from transformers.video_processing_utils import BaseVideoProcessor

    config, _ = BaseVideoProcessor.get_video_processor_dict(str(folder))
    return config


def test_an_image_only_processor_saves_what_the_full_class_loads(tiny_policy, tmp_path):
    """Without torchvision the policy's processor is loaded image-only; saved as it was, a checkpoint had
    no video processor, and the full class (vLLM, any machine with torchvision) failed to load it. Saved
    now with the video entry that transformers reads from a checkpoint holding only an image processor
    config (how the published Qwen2.5-VL checkpoints load)."""
    from balcaprl.recipe import ModelConfig
    from balcaprl.train.modeling import load_processor

    processor = load_processor(ModelConfig(path=str(tiny_policy)))
    assert not hasattr(processor, "video_processor")  # image-only here (no torchvision)
    processor.save_pretrained(tmp_path / "saved")
    image = json.loads((tmp_path / "saved" / "processor_config.json").read_text())["image_processor"]
    legacy = tmp_path / "legacy"  # the image processor config alone, in the file name before transformers 5
    legacy.mkdir()
    (legacy / "preprocessor_config.json").write_text(json.dumps(image))
    read_legacy = _video_processor(legacy)
    kind = read_legacy.pop("image_processor_type").replace(
        "ImageProcessor", "VideoProcessor"
    )  # transformers' rule
    assert _video_processor(tmp_path / "saved") == {**read_legacy, "video_processor_type": kind}
    assert kind == "Qwen2VLVideoProcessor"
    shutil.copy(tiny_policy / "config.json", tmp_path / "saved")  # a checkpoint's, naming the architecture
    again = load_processor(ModelConfig(path=str(tmp_path / "saved")))  # and it still loads image-only here
    assert again.image_processor.to_dict() == processor.image_processor.to_dict()


class _Accelerator:
    """The two things save_final_model asks accelerate for, on one process: a barrier and the gathered
    full state dict (under FSDP2 accelerate's get_state_dict gathers the shards; here there is one)."""

    def __init__(self, state_dict_type: str):
        self.state = SimpleNamespace(fsdp_plugin=SimpleNamespace(state_dict_type=state_dict_type))
        self.gathered = 0

    def wait_for_everyone(self):
        pass

    def get_state_dict(self, model):
        self.gathered += 1
        return {k: v.clone() for k, v in model.state_dict().items()}


def test_final_is_whole_when_checkpoints_are_fsdp_shards(tiny_policy, tmp_path):
    """accelerate enables FSDP only on GPUs, so the sharded run itself cannot run here: what is tested is
    that save_final_model gathers the full state dict instead of the Trainer's save_model (which writes
    no weights under SHARDED_STATE_DICT) and that final/ loads with from_pretrained."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_policy, dtype=torch.float32)
    accelerator = _Accelerator("StateDictType.SHARDED_STATE_DICT")

    def _save(output_dir, state_dict):
        model.save_pretrained(output_dir, state_dict=state_dict)

    def save_model(output_dir):
        raise AssertionError("save_model writes no weights under SHARDED_STATE_DICT; gather instead")

    trainer = SimpleNamespace(
        is_fsdp_enabled=True,
        accelerator=accelerator,
        model=model,
        args=SimpleNamespace(should_save=True),
        _save=_save,
        save_model=save_model,
    )
    save_final_model(trainer, tmp_path / "final")
    assert accelerator.gathered == 1
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "final", dtype=torch.float32)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_fsdp_config_shards_checkpoints_and_the_plan_counts_their_disk():
    launcher = launcher_from_accelerate(ROOT / "configs" / "accelerate" / "fsdp.yaml")
    assert launcher.sharded_checkpoints
    from balcaprl.recipe import load_recipe

    recipe = load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml")
    shape = model_shape(recipe.model.path)
    params = 3_754_622_976
    # fp32 weights once + AdamW's two fp32 moments; FULL_STATE_DICT wrote the weights twice.
    assert checkpoint_disk(shape, recipe, launcher) == (12 * params, 4 * params, "sharded")
    full = launcher.__class__(**{**launcher.__dict__, "sharded_checkpoints": False})
    assert checkpoint_disk(shape, recipe, full)[0] == 16 * params
    assert recipe.run.save_total_limit == 2
    from balcaprl.plan.memory import plan_memory

    plan = plan_memory(recipe, launcher)
    assert (plan.checkpoint_bytes, plan.final_bytes) == (12 * params, 4 * params)
    assert (
        "disk: 42.0 GiB per checkpoint (sharded), at most 2 kept: 83.9 GiB; final/ 14.0 GiB" in plan.to_text()
    )


def test_resume_passes_over_a_truncated_or_halved_checkpoint(tiny_policy, tiny_dataset, tmp_path, capsys):
    """A real run's checkpoints, damaged as a full disk or a copy cut short leaves them: the resume
    goes on from the last good one (one line says which was passed over and why) instead of dying in
    safetensors or torch.load."""
    out = tmp_path / "run"
    recipe = recipe_from_dict(
        tiny_recipe_dict(tiny_policy, tiny_dataset, out, data={"max_samples": 4}, train={"max_steps": 2})
    )
    train(recipe, ScriptedJudge())
    assert [incomplete_reason(out / f"checkpoint-{n}") for n in (1, 2)] == [None, None]
    for spoil, file in ((lambda p: os.truncate(p, 1000), "model.safetensors"),
                        (lambda p: os.truncate(p, p.stat().st_size // 2), "optimizer.pt")):  # fmt: skip
        target = out / "checkpoint-2" / file
        size = target.stat().st_size
        spoil(target)
        cut = target.stat().st_size
        capsys.readouterr()
        resumed = train(recipe, ScriptedJudge(), resume=True)
        assert resumed.resumed_from == out / "checkpoint-1" and resumed.global_step == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if "skipping" in line]
        assert lines == [
            f"note: skipping {out / 'checkpoint-2'}: incomplete ({file} has {cut:,} bytes, {size:,} were "
            "written); resuming from an earlier checkpoint"
        ]
        assert incomplete_reason(out / "checkpoint-2") is None  # saved again, whole
