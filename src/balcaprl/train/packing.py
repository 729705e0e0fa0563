"""Padding-free micro-batches for TRL's log-prob passes (``train.padding_free``), Qwen2/2.5-VL.

TRL 1.16's GRPOTrainer runs each micro-batch at the generation batch's padded width: prompts padded on
the left to the longest prompt, captions on the right to the longest caption. With captions of ~250
tokens against a cap of 1,024 and images of 300-1,280 tokens, much of that width is padding, and the
backbone computes it all. :class:`PackedLogProbs` replaces ``_get_per_token_logps_and_entropies`` (the
one function TRL runs the policy through, for the old log-probs and for the loss) with a packed
forward: the micro-batch's real tokens in one row, with no attention mask. The language model's
attention reads each sample's bounds from the text positions that restart at 0 for every sample and
runs a variable-length kernel (``train/varlen_attention.py``: no ``tokens x tokens`` mask; the model
takes packed rows as ``[4, 1, tokens]`` position ids: text positions, then the three rope axes). The rope positions are each sample's own,
computed exactly as the padded forward computes them (``compute_3d_position_ids`` on the padded
micro-batch, then the real tokens taken). Log-probs and entropies are scattered back into the padded
``[batch, logits_to_keep]`` layout TRL's loss reads, so everything downstream is unchanged.

Equal to the padded pass: rotary attention depends only on position differences within a sample, and
each token attends to exactly the tokens of its own sample before it. A test compares log-probs, loss
and gradients on the tiny Qwen2.5-VL (float32). Other architectures (LLaVA), MoE auxiliary losses and
inputs this does not know fall back to TRL's padded pass.
"""

from __future__ import annotations

from typing import Any

import torch

from balcaprl.train.varlen_attention import use_varlen_text_attention


def rope_model(model: Any) -> Any | None:
    """The Qwen2/2.5-VL inner model (the one with ``compute_3d_position_ids``) inside ``model`` (FSDP, peft
    and accelerate wrappers included), or None."""
    for module in model.modules():
        if hasattr(module, "compute_3d_position_ids") and hasattr(module, "get_rope_index"):
            return module
    return None


def pack_rows(
    inner: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    mm_token_type_ids: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """The packed model inputs of a padded micro-batch: ``input_ids [1, tokens]`` and
    ``position_ids [4, 1, tokens]`` (text positions restarting per sample, then the padded forward's rope
    positions of the same tokens)."""
    mask = attention_mask.bool()
    rope = inner.compute_3d_position_ids(
        input_ids=input_ids,
        image_grid_thw=image_grid_thw,
        video_grid_thw=None,
        inputs_embeds=None,
        attention_mask=attention_mask,
        past_key_values=None,
        mm_token_type_ids=mm_token_type_ids,
    )
    text = attention_mask.long().cumsum(-1) - 1  # 0, 1, 2, ... over each sample's real tokens
    if rope is None:  # no multimodal token types: the model would use plain positions (rope is relative)
        rope = text[None].expand(3, -1, -1)
    positions = torch.cat([text[None], rope.to(text.device)], dim=0)  # [4, batch, width]
    packed = {
        "input_ids": input_ids[mask][None],
        "position_ids": positions[:, mask][:, None, :],
    }
    if mm_token_type_ids is not None:
        packed["mm_token_type_ids"] = mm_token_type_ids[mask][None]
    return packed


def _unpack(values: torch.Tensor, mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """Packed per-token values (``[1, tokens - 1]``: entry j scores packed token j + 1) -> the padded
    layout of TRL's fused head (``[batch, width - 1]``: entry i scores token i + 1), last ``logits_to_keep``."""
    per_token = torch.cat(
        [values.new_zeros(1), values[0]]
    )  # token k's value; a sample's first token has none
    full = values.new_zeros(mask.shape).masked_scatter(mask, per_token)
    return full[:, 1:][:, -logits_to_keep:]


class PackedLogProbs:
    """GRPOTrainer mixin: ``_get_per_token_logps_and_entropies`` on packed rows (module docstring)."""

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        pixel_values=None,
        image_grid_thw=None,
        num_images=None,
        mm_token_type_ids=None,
        **others,
    ):
        inner = rope_model(model)
        unknown = any(value is not None for value in others.values())
        if (
            inner is None
            or compute_aux_loss
            or unknown
            or (pixel_values is not None and image_grid_thw is None)
        ):
            return super()._get_per_token_logps_and_entropies(  # type: ignore[misc]
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                compute_aux_loss, pixel_values=pixel_values, image_grid_thw=image_grid_thw,
                num_images=num_images, mm_token_type_ids=mm_token_type_ids, **others,
            )  # fmt: skip
        use_varlen_text_attention(inner)  # sdpa -> packed rows without a dense mask (idempotent)
        batch_size = batch_size or input_ids.size(0)
        if pixel_values is not None:  # pixel rows per sample, as TRL slices them
            rows = torch.stack([s.sum() for s in torch.split(image_grid_thw.prod(dim=-1), num_images)])
            cum_rows = torch.cat([rows.new_zeros(1), rows.cumsum(0)]).tolist()
            cum_images = torch.tensor([0, *num_images]).cumsum(0).tolist()
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask = input_ids[start:end], attention_mask[start:end]
            grid = image_grid_thw[cum_images[start] : cum_images[end]] if pixel_values is not None else None
            types = mm_token_type_ids[start:end] if mm_token_type_ids is not None else None
            inputs = pack_rows(inner, ids, mask, grid, types)
            if pixel_values is not None:
                inputs["pixel_values"] = pixel_values[cum_rows[start] : cum_rows[end]]
                inputs["image_grid_thw"] = grid
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-logits_to_keep] = -100  # only the completion tokens are scored
            packed_labels = labels[mask.bool()][None]
            with self.accelerator.autocast():  # type: ignore[attr-defined]
                outputs = model(**inputs, labels=packed_labels, fused_lm_head=True)
            all_logps.append(_unpack(outputs.log_probs, mask.bool(), logits_to_keep))
            if compute_entropy:
                all_entropies.append(_unpack(outputs.entropy, mask.bool(), logits_to_keep))
        logps = torch.cat(all_logps, dim=0)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        return logps, entropies, None
