"""vLLM 0.31 loads each recipe family's tiny checkpoint as balcaprl starts it and captions images."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from engine_kit import engine, image_prompt  # noqa: E402
from transformers import AutoProcessor  # noqa: E402

from balcaprl.train.rollout_engine import banned_tokens, sampling_ban, stop_token_ids  # noqa: E402

FAMILIES = ["tiny_qwen2_5_vl", "tiny_qwen2_vl", "tiny_llava"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_loads_and_captions_images_with_special_tokens_masked(family, request):
    from vllm import SamplingParams

    path = request.getfixturevalue(family)
    processor = AutoProcessor.from_pretrained(path)
    tokenizer = processor.tokenizer
    banned = banned_tokens(tokenizer, stop_token_ids(tokenizer, None))
    image_token = tokenizer.convert_tokens_to_ids(processor.image_token)
    assert image_token in banned and tokenizer.eos_token_id not in banned
    # temperature 2 flattens the random model's distribution: unmasked, 2 x 4 x 24 draws from a
    # vocabulary of ~40 tokens would hold every special token many times over
    params = SamplingParams(n=4, max_tokens=24, temperature=2.0, seed=0, ignore_eos=True,
                            **sampling_ban(banned, "vllm"))  # fmt: skip
    with engine(path) as llm:
        prompts = [image_prompt(processor, (200, 10, 10)), image_prompt(processor, (10, 10, 200))]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        unmasked = llm.generate(prompts, SamplingParams(n=4, max_tokens=24, temperature=2.0, seed=0, ignore_eos=True),
                                use_tqdm=False)  # fmt: skip
    completions = [list(c.token_ids) for output in outputs for c in output.outputs]
    assert len(completions) == 8 and all(len(ids) == 24 for ids in completions)
    assert not {t for ids in completions for t in ids} & set(banned)
    # the mask is what keeps them out: the same draws without it sample special tokens
    drawn = {t for output in unmasked for c in output.outputs for t in c.token_ids}
    assert drawn & set(banned), "the unmasked engine drew no special token: the test cannot tell"


def test_the_engine_starts_from_a_policy_the_trainer_saved(tiny_qwen2_5_vl, tiny_dataset, tmp_path):
    """balcaprl's own save path (save_final_model: the trainer's model and its processor, loaded image-only
    without torchvision) writes a checkpoint vLLM starts from and captions with, its video processor
    entry included: without it the full Qwen processor class, which vLLM builds wherever torchvision is
    installed, failed ("Can't load video processor"; here the CPU set-up builds it image-only)."""
    from train_testkit import ScriptedJudge, tiny_recipe_dict
    from transformers.video_processing_utils import BaseVideoProcessor
    from vllm import SamplingParams

    from balcaprl.recipe import recipe_from_dict
    from balcaprl.train import build_trainer
    from balcaprl.train.checkpointing import save_final_model

    trainer = build_trainer(
        recipe_from_dict(tiny_recipe_dict(tiny_qwen2_5_vl, tiny_dataset, tmp_path / "run")), ScriptedJudge()
    )
    final = tmp_path / "run" / "final"
    save_final_model(trainer, final)
    del trainer
    config, _ = BaseVideoProcessor.get_video_processor_dict(str(final))
    assert config["video_processor_type"] == "Qwen2VLVideoProcessor"
    processor = AutoProcessor.from_pretrained(final)
    with engine(final) as llm:
        (output,) = llm.generate(
            [image_prompt(processor, (10, 200, 10))],
            SamplingParams(n=2, max_tokens=8, seed=0),
            use_tqdm=False,
        )
    assert [len(c.token_ids) > 0 for c in output.outputs] == [True, True]
