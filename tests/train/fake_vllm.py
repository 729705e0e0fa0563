"""A stand-in for vLLM's ``LLM`` and ``SamplingParams`` (vLLM has no CPU wheel), just enough for TRL's
colocate path: it records how it was built, processes each prompt's image with its *own* image
processor, as vLLM does (the checkpoint's processor, with the ``mm_processor_kwargs`` it was given or
without them), and refuses a prompt whose image-token count differs from what that processor makes,
as vLLM does. Completions are a few random tokens with log-probs."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any


class FakeSamplingParams:
    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs


class FakeLLM:
    """``honour_processor_kwargs=False`` plays an engine at its checkpoint's defaults (a vLLM server started
    without ``--mm-processor-kwargs``)."""

    instances: list[FakeLLM] = []
    honour_processor_kwargs = True

    def __init__(self, model: str, **kwargs: Any):
        from transformers import AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.model = model
        self.kwargs = kwargs
        given = kwargs.get("mm_processor_kwargs") or {}
        self.processor_kwargs = dict(given) if self.honour_processor_kwargs else {}
        # The checkpoint's Qwen2-VL image processor (the PIL implementation: no torchvision on CPU; the
        # grid, and so the token count, is the same rule in every implementation).
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(model, **self.processor_kwargs)
        tokenizer = AutoTokenizer.from_pretrained(model)
        self.image_token_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
        self.counts: list[tuple[int, int]] = []  # (image tokens in the prompt, image tokens the engine makes)
        self.image_sizes: list[tuple[int, int]] = []
        self.loaded_weights: list[str] = []
        self.random = random.Random(0)
        worker = SimpleNamespace(model_runner=SimpleNamespace(model=SimpleNamespace(load_weights=self._load)))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker))
        FakeLLM.instances.append(self)

    def _load(self, weights):
        self.loaded_weights.extend(name for name, _ in weights)

    def engine_image_tokens(self, image) -> int:
        grid = self.image_processor(images=[image], return_tensors="pt")["image_grid_thw"]
        return int(grid.prod()) // self.image_processor.merge_size**2

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        outputs = []
        for prompt in prompts:
            ids = list(prompt["prompt_token_ids"])
            image = prompt["multi_modal_data"]["image"]
            in_prompt, made = ids.count(self.image_token_id), self.engine_image_tokens(image)
            self.counts.append((in_prompt, made))
            self.image_sizes.append(image.size)
            if in_prompt != made:
                raise ValueError(
                    f"vLLM: the prompt has {in_prompt} image placeholder tokens, the image makes {made}"
                )
            tokens = [self.random.choice(self.vocab) for _ in range(self.random.randint(1, 4))]
            tokens.append(self.eos_token_id)
            logprobs = [{token: SimpleNamespace(logprob=-1.0, rank=1)} for token in tokens]
            completion = SimpleNamespace(token_ids=tokens, logprobs=logprobs)
            outputs.append(SimpleNamespace(prompt_token_ids=ids, outputs=[completion]))
        return outputs

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags=None) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass
