"""Every private name of TRL, transformers' Trainer and vLLM that balcaprl's TRL backend relies on, in
one place, with what it is used for.

TRL 1.16 documents no hook for what the paper's step needs at these points (the batch's advantages,
a colocated engine's arguments, each rollout as the engine finishes it), so the backend overrides or
wraps these names. An upgrade that renames one would not always fail loudly: the per-rollout judge
overlap, for one, would quietly become the batch schedule (rewards unchanged, the step slower). So
:func:`missing` checks that each still exists in the installed versions, and the real-engine slice
(``tests/vllm_engine``: TRL colocate training on vLLM's own engine, a vLLM server on 127.0.0.1) runs
each of them; a moved name fails a test there. ``judge/started_early_share`` and a warning once per
run show it in a run as well.

Public seams used instead of private ones where TRL 1.16 has them: ``GRPOConfig.generation_kwargs``
(the special-token mask at sampling, both engines), the reward functions (``reward_funcs``), callbacks.
``rollout_func`` is not used: TRL 1.16 marks it experimental ("may change or be removed at any time
without prior notice"), and with it TRL no longer runs its own vLLM generation (image features,
placement, sleep mode, tensor parallelism, weight sync timing), so balcaprl would re-implement those
on the same private names (``_tokenize_prompts``, the engine's loop) rather than drop any.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PrivateName:
    owner: str  # "module:Class" or "module" for a module global
    name: str
    use: str  # what balcaprl does with it, and where
    on_instance: bool = False  # an attribute __init__ sets: checked on a trainer, not on the class

    def exists(self, trainer: object | None = None) -> bool:
        if self.on_instance:
            return trainer is None or hasattr(trainer, self.name)
        module_name, _, qualname = self.owner.partition(":")
        target: object = importlib.import_module(module_name)
        for part in qualname.split(".") if qualname else ():
            target = getattr(target, part)
        return hasattr(target, self.name)


_TRAINER = "trl.trainer.grpo_trainer:GRPOTrainer"
_GENERATION = "trl.generation.vllm_generation:VLLMGeneration"
_CLIENT = "trl.generation.vllm_client:VLLMClient"

PRIVATE_NAMES: tuple[PrivateName, ...] = (
    # -- TRL's GRPOTrainer (trl_backend.BalancedGRPOTrainer)
    PrivateName(_TRAINER, "_generate_and_score_completions",
                "overridden: the batch step's advantages replace TRL's (trl_backend); the overlap's batch scope"),
    PrivateName(_TRAINER, "_calculate_rewards", "overridden: the gathered (N, 3) rewards; judge stage metrics"),
    PrivateName(_TRAINER, "_generate",
                "overridden: completions checked for masked tokens (output[1] ids); the overlap's watch "
                "and settle (output[3] completions)"),
    PrivateName(_TRAINER, "_compute_loss", "overridden: ratio and clipping metrics around TRL's loss"),
    PrivateName(_TRAINER, "_get_per_token_logps_and_entropies",
                "patched per call in _compute_loss (ratio metrics); overridden by train/packing.py"),
    PrivateName(_TRAINER, "_metrics", "written: balcaprl's per-step metrics beside TRL's", on_instance=True),
    PrivateName(_TRAINER, "_logs", "written: the completion log shows balcaprl's advantages", on_instance=True),
    PrivateName(_TRAINER, "async_loop", "read: the reward functions' event loop the early judge starts calls on",
                on_instance=True),
    PrivateName(_TRAINER, "_tokenizer", "read: whether TRL decodes with parse_response (then no per-rollout "
                "overlap)", on_instance=True),
    PrivateName(_TRAINER, "_get_train_sampler", "overridden: an epoch-seeded RepeatSampler (resumable)"),
    PrivateName(_TRAINER, "_load_from_checkpoint", "overridden: weights restored through from_pretrained"),
    PrivateName(_TRAINER, "_save_checkpoint", "overridden: atomic checkpoints (train/checkpointing.py)"),
    # -- TRL's vLLM generation and client
    PrivateName("trl.generation.vllm_generation", "LLM",
                "module global bound to LLM with balcaprl's engine arguments while the trainer is built "
                "(trl_backend.vllm_engine_kwargs: image-only limits, dtype, pixel limits, LLaVA load)"),
    PrivateName(_GENERATION, "_place_features",
                "wrapped: a vLLM server's image-token counts compared with the trainer's (server mode)"),
    PrivateName(_GENERATION, "_fix_param_name_to_vllm",
                "wrapped: LLaVA's weights synced under vLLM's names (rollout_engine.vllm_param_name)"),
    PrivateName(_CLIENT, "_generate_from_features",
                "wrapped per call on the main process: a server response's rollouts, every process's, judged "
                "as it arrives (judge_overlap; the rows cut by process as VLLMGeneration.generate slices them)"),
    PrivateName(_CLIENT, "_post", "wrapped per call: each prompt's response, found by its token-id list"),
    # -- vLLM's engine as LLM.generate drives it (public methods of an internal object)
    PrivateName("vllm.v1.engine.llm_engine:LLMEngine", "add_request",
                "wrapped per call: request ids numbered in the order LLM.generate adds them (judge_overlap)"),
    PrivateName("vllm.v1.engine.llm_engine:LLMEngine", "step",
                "wrapped per call: each rollout judged as the step that finishes it returns (judge_overlap)"),
)  # fmt: skip


def missing(trainer: object | None = None, names: tuple[PrivateName, ...] = PRIVATE_NAMES) -> list[str]:
    """The names that the installed libraries no longer have (``owner.name``); modules not installed
    (vLLM without the ``[vllm]`` extra) are skipped, and so are instance attributes without ``trainer``."""
    gone = []
    for entry in names:
        try:
            present = entry.exists(trainer)
        except ModuleNotFoundError:
            continue
        except AttributeError:  # the owner class itself moved
            present = False
        if not present:
            gone.append(f"{entry.owner}.{entry.name}")
    return gone
