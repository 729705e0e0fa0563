"""verl's reward manager for balcaprl: verl's ``naive`` manager, with each rollout's generated token ids
handed to ``compute_score`` (``extra_info["response_ids"]``).

verl 0.9.1's ``naive`` manager decodes the response and passes ``compute_score`` the text only; counting
the caption's length by re-encoding that text can differ from the tokens the policy generated (a
tokenizer does not round-trip every id sequence), so the length mask could decide differently from the
TRL backend, which counts the generated ids. ``balcaprl verl launch`` renders
``reward.reward_manager.source=importlib`` with this class; ``compute_score`` counts the ids it is given
exactly as TRL's reward functions do (:func:`~balcaprl.train.judging.count_caption_tokens`).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

from balcaprl.train.verl_backend.reward import RESPONSE_IDS


class BalcaprlRewardManager(NaiveRewardManager):
    """``naive`` plus the rollout's generated ids in its ``extra_info``."""

    async def run_single(self, data: Any) -> dict:
        item = data[-1:][0]  # the sequence naive scores (the last one of a multi-sequence output)
        responses = item.batch["responses"]
        length = int(item.batch["attention_mask"][-responses.shape[-1] :].sum())
        extra_info = item.non_tensor_batch.get("extra_info")
        if isinstance(extra_info, dict):  # the row's own dict, which naive hands to compute_score
            extra_info[RESPONSE_IDS] = [int(t) for t in responses[:length].tolist()]
        return await super().run_single(data)
