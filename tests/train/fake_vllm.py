"""A stand-in for vLLM's ``LLM`` and ``SamplingParams`` (vLLM has no CPU wheel), just enough for TRL's
colocate path: it records how it was built, processes each prompt's image with its *own* image
processor, as vLLM does (the checkpoint's processor, with the ``mm_processor_kwargs`` it was given or
without them), and refuses a prompt whose image-token count differs from what that processor makes,
as vLLM does. Completions are a few random tokens with log-probs.

:class:`ScriptedServerClient` stands in for TRL's ``VLLMClient`` in front of a vLLM server (server mode).

``generate`` drives a stand-in of vLLM's engine the way vLLM's ``LLM.generate`` does (``_run_engine``):
it adds every request under a request id counted up from 0 across calls, then loops ``step()``, which
finishes one request at a time, shortest completion first (a seeded tie-break), not in the order the
requests were added; the outputs come back sorted by request id."""

from __future__ import annotations

import itertools
import random
import threading
from types import SimpleNamespace
from typing import Any

from trl.generation.vllm_client import VLLMClient


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
        self.llm_engine = FakeEngine(SimpleNamespace(driver_worker=worker), self)
        self.request_counter = itertools.count()
        FakeLLM.instances.append(self)

    def _load(self, weights):
        self.loaded_weights.extend(name for name, _ in weights)

    def engine_image_tokens(self, image) -> int:
        grid = self.image_processor(images=[image], return_tensors="pt")["image_grid_thw"]
        return int(grid.prod()) // self.image_processor.merge_size**2

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        """vLLM's ``LLM.generate``: add all requests, step the engine until none is left, sort by id."""
        for prompt in prompts:
            self.llm_engine.add_request(str(next(self.request_counter)), prompt, sampling_params)
        outputs = []
        while self.llm_engine.has_unfinished_requests():
            outputs.extend(output for output in self.llm_engine.step() if output.finished)
        return sorted(outputs, key=lambda output: int(output.request_id))

    def complete(self, request_id: str, prompt) -> SimpleNamespace:
        """One request's finished output (the image checked as vLLM's input processor does)."""
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
        return SimpleNamespace(
            request_id=request_id, finished=True, prompt_token_ids=ids, outputs=[completion]
        )

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags=None) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass


class FakeEngine:
    """vLLM's ``LLMEngine`` as ``LLM.generate`` drives it: ``add_request`` (the request id first),
    ``has_unfinished_requests``, and ``step``, which returns the outputs that finished in it: here
    one per step, the shortest completion first. ``finished``: request ids in the order they finished."""

    def __init__(self, model_executor, llm: FakeLLM):
        self.model_executor = model_executor
        self.llm = llm
        self.unfinished: list[tuple[float, SimpleNamespace]] = []
        self.finished: list[str] = []

    def add_request(self, request_id: str, prompt, params=None, **kwargs: Any) -> None:
        output = self.llm.complete(request_id, prompt)
        self.unfinished.append((len(output.outputs[0].token_ids) + self.llm.random.random(), output))

    def has_unfinished_requests(self) -> bool:
        return bool(self.unfinished)

    def get_num_unfinished_requests(self) -> int:
        return len(self.unfinished)

    def step(self) -> list[SimpleNamespace]:
        if not self.unfinished:
            return []
        first = min(range(len(self.unfinished)), key=lambda i: self.unfinished[i][0])
        _, output = self.unfinished.pop(first)
        self.finished.append(output.request_id)
        return [output]


def stand_in_vllm(monkeypatch: Any) -> type[FakeLLM]:
    """TRL's colocate path with the stand-in engine (tests/train/fake_vllm.py); TRL's distributed
    environment variables restored when ``monkeypatch`` undoes its changes."""
    from trl.generation import vllm_generation

    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(vllm_generation, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(vllm_generation, "SamplingParams", FakeSamplingParams, raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "0" if "RANK" in name else "1" if name == "WORLD_SIZE" else "")
        monkeypatch.delenv(name)
    FakeLLM.instances.clear()
    monkeypatch.setattr(FakeLLM, "honour_processor_kwargs", True)
    return FakeLLM


class ScriptedServerClient:
    """TRL's ``VLLMClient`` in front of a scripted vLLM server: TRL's own ``generate`` and
    ``_generate_from_features`` (one request per prompt from a thread pool) over ``image_features``
    (each prompt's image one run of ``image_tokens`` placeholders) and ``_post``, which answers the
    prompts last first: prompt ``j`` (the first token of its ids) once prompt ``j + 1`` is released,
    by the caller (:meth:`release`, ``released_by_caller``) or as soon as it is answered. Each prompt
    gets ``n`` completions of two vocabulary words, which differ from rollout to rollout."""

    generate = VLLMClient.generate
    _generate_from_features = VLLMClient._generate_from_features
    base_url, model = "http://vllm.invalid", "policy"

    def __init__(
        self, prompts: int, vocab: list[int], image_tokens: int = 4, released_by_caller: bool = False
    ):
        self.vocab, self.image_tokens, self.released_by_caller = vocab, image_tokens, released_by_caller
        self.released = [threading.Event() for _ in range(prompts)]
        self.order: list[int] = []

    def release(self, j: int) -> None:
        self.released[j].set()

    def image_features(self, images: list) -> list[dict]:
        return [{"mm_placeholders": {"image": [{"offset": 0, "length": self.image_tokens}]}} for _ in images]

    def _post(self, url: str, json: dict) -> dict:
        j = int(json["token_ids"][0])
        if j + 1 < len(self.released):
            assert self.released[j + 1].wait(timeout=30), f"deadlock guard: prompt {j + 1} was never released"
        self.order.append(j)
        if not self.released_by_caller:
            self.release(j)
        n, vocab = json["sampling_params"]["n"], self.vocab
        tokens = [[vocab[(j * n + k) % len(vocab)], vocab[k]] for k in range(n)]
        return {"choices": [{"token_ids": ids, "logprobs": None} for ids in tokens]}
