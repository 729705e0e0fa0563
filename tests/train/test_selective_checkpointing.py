"""Selective activation checkpointing on the tiny Qwen2.5-VL: the last N decoder layers run once, every
other layer (the vision tower's too) is recomputed in the backward pass, and the gradients are those of
full recompute."""

from __future__ import annotations

import torch
from PIL import Image

from balcaprl.recipe import ModelConfig
from balcaprl.train.modeling import (
    keep_activations,
    keep_activations_on_enable,
    language_model_layers,
    load_processor,
)


def tiny_batch(path):
    processor = load_processor(ModelConfig(path=str(path)))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True) + " red circle"
    image = Image.new("RGB", (56, 56), (200, 30, 30))
    return dict(processor(text=[text, text], images=[image, image], return_tensors="pt"))


def load(path, layers_without_recompute=0):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    if layers_without_recompute:
        keep_activations_on_enable(model, layers_without_recompute)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def step(model, batch):
    """One forward and backward; returns how often each decoder layer and vision block ran, and the grads."""
    calls: dict[str, int] = {}

    def counter(name):
        def hook(module, args):
            calls[name] = calls.get(name, 0) + 1

        return hook

    # Pre-hooks: torch's recompute stops early, once it has what the backward needs, before a forward
    # hook would fire.
    handles = [
        module.register_forward_pre_hook(counter(name))
        for name, module in model.named_modules()
        if name.endswith(
            ("language_model.layers.0", "language_model.layers.1", "visual.blocks.0", "visual.blocks.1")
        )
    ]
    model.zero_grad()
    output = model(**batch, labels=batch["input_ids"])
    output.loss.backward()
    for handle in handles:
        handle.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {n.removeprefix("model."): c for n, c in calls.items()}, grads


def test_the_last_layers_keep_their_activations_and_the_rest_recompute(tiny_policy):
    batch = tiny_batch(tiny_policy)
    full = load(tiny_policy)
    full_calls, full_grads = step(full, batch)
    # Plain checkpointing: every layer runs twice (forward, then the recompute in backward).
    assert full_calls == {
        "language_model.layers.0": 2,
        "language_model.layers.1": 2,
        "visual.blocks.0": 2,
        "visual.blocks.1": 2,
    }

    selective = load(tiny_policy, layers_without_recompute=1)
    assert [layer.gradient_checkpointing for layer in language_model_layers(selective)] == [True, False]
    # TRL turns checkpointing off around generate and on again: the choice survives.
    selective.gradient_checkpointing_disable()
    selective.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert [layer.gradient_checkpointing for layer in language_model_layers(selective)] == [True, False]
    calls, grads = step(selective, batch)
    assert calls == {
        "language_model.layers.0": 2,  # recomputed
        "language_model.layers.1": 1,  # kept: no recompute
        "visual.blocks.0": 2,  # the vision tower stays checkpointed
        "visual.blocks.1": 2,
    }
    assert grads.keys() == full_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, full_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_more_layers_than_the_model_has_keeps_them_all(tiny_policy):
    model = load(tiny_policy)
    assert keep_activations(model, 10) == [0, 1]  # the 3B recipe's 10 on the 2-layer model
    assert [layer.gradient_checkpointing for layer in language_model_layers(model)] == [False, False]
    assert keep_activations(load(tiny_policy), 0) == []


def test_a_training_run_applies_the_recipes_choice(tiny_policy, tiny_dataset, tmp_path):
    from train_testkit import ScriptedJudge, tiny_recipe_dict
    from transformers import TrainerCallback

    from balcaprl.recipe import recipe_from_dict
    from balcaprl.train import train

    seen = []

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            seen.append([layer.gradient_checkpointing for layer in language_model_layers(model)])

    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy,
            tiny_dataset,
            tmp_path / "run",
            model={"gradient_checkpointing": True, "layers_without_recompute": 1},
            train={"max_steps": 1},
        )
    )
    train(recipe, ScriptedJudge(), callbacks=[Probe()])
    assert seen == [[True, False]]
