"""The policy's model card: the base model, the recipe and how to load it, instead of TRL's stub."""

from __future__ import annotations

from pathlib import Path

from train_testkit import tiny_recipe_dict

from balcaprl.recipe import recipe_from_dict
from balcaprl.train.model_card import model_card, write_model_card


def recipe(tmp_path, policy="Qwen/Qwen2.5-VL-3B-Instruct", **sections):
    return recipe_from_dict(tiny_recipe_dict(policy, tmp_path / "data", tmp_path / "run", **sections))


def test_the_card_names_the_base_model_the_recipe_and_how_to_load(tmp_path):
    card = model_card(
        recipe(tmp_path, rewards={"weights": {"precision": 0.2}}), global_step=3, where="runs/x/final"
    )
    assert card.startswith("---\n") and "\nbase_model: Qwen/Qwen2.5-VL-3B-Instruct\n" in card  # a hub id
    assert "`Qwen/Qwen2.5-VL-3B-Instruct` trained with reinforcement learning" in card
    assert "| reward weights (precision / recall / linguistic) | 0.2 / 0.3 / 0.3 |" in card
    assert "| optimizer steps | 3 of 3 |" in card and "| advantage estimator | c_gdpo |" in card
    assert "| length control | mask, rho band [0.5, 2] |" in card
    assert 'AutoModelForImageTextToText.from_pretrained("runs/x/final")' in card
    assert "[None]" not in card and "PeftModel" not in card


def test_a_local_base_model_is_named_but_not_claimed_as_a_hub_id_and_lora_loads_through_peft(tmp_path):
    local = tmp_path / "my-policy"
    local.mkdir()
    card = model_card(recipe(tmp_path, str(local)), where="out/final")
    assert "base_model:" not in card and f"`{local}` trained" in card
    lora = model_card(recipe(tmp_path, str(local), model={"lora": {"r": 8}}), where="out/final")
    assert f'base = AutoModelForImageTextToText.from_pretrained("{local}")' in lora
    assert (
        'PeftModel.from_pretrained(base, "out/final")' in lora
        and "| weights trained | LoRA adapters |" in lora
    )


def test_write_model_card_replaces_a_stub(tmp_path):
    (tmp_path / "README.md").write_text(
        "This model is a fine-tuned version of [None](https://huggingface.co/None)."
    )
    path = write_model_card(tmp_path, recipe(tmp_path))
    assert path == tmp_path / "README.md" and "[None]" not in Path(path).read_text()
