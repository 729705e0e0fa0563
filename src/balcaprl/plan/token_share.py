"""How much of a padded micro-batch is real tokens, on a prepared dataset (``balcaprl train --plan``).

TRL 1.16 pads each process's generation batch once: prompts on the left to the longest prompt, captions
on the right to the longest caption, and every micro-batch of the update keeps that width. The real
tokens of a row are its prompt (image tokens + the chat template) and its caption. Packed rows
(``train.padding_free``) carry the real tokens alone, so their share is 1.

The policy's caption lengths are unknown before training; the dataset's reference lengths
(``reference_tokens``, in the policy's tokenizer, else 4/3 tokens a word: an estimate) capped at
``rollout.max_caption_tokens`` stand in for them, each prompt's rollouts all at its reference's length.
Sampled captions spread around that length, so a generation batch's longest caption is longer in a real
run and its padding larger: the share given here is an upper bound on the real-token share.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WORD_TOKENS = 4 / 3  # tokens a word when the dataset has no reference_tokens (an estimate)


@dataclass(frozen=True)
class Lengths:
    """One sample's prompt tokens (image + text) and its caption's (capped)."""

    prompt: int
    caption: int


@dataclass(frozen=True)
class TokenShare:
    real: int
    padded: int
    rows: int
    counted: bool  # caption lengths from reference_tokens (True) or from words (False)

    @property
    def share(self) -> float:
        return self.real / self.padded if self.padded else 1.0


def padded_batches(lengths: list[Lengths], prompts_per_generation: int, rollouts: int) -> TokenShare:
    """Real and padded tokens when each run of ``prompts_per_generation`` prompts (one process's
    generation batch, ``rollouts`` captions each) is padded to its longest prompt + longest caption."""
    real = padded = rows = 0
    for start in range(0, len(lengths), prompts_per_generation):
        batch = lengths[start : start + prompts_per_generation]
        width = max(s.prompt for s in batch) + max(s.caption for s in batch)
        real += rollouts * sum(s.prompt + s.caption for s in batch)
        padded += rollouts * len(batch) * width
        rows += rollouts * len(batch)
    return TokenShare(real, padded, rows, counted=True)


def dataset_lengths(dataset_dir: Path | str, recipe, split: str = "train") -> tuple[list[Lengths], bool]:
    """Each sample's :class:`Lengths` on a prepared dataset folder, and whether the caption lengths are
    counted (``reference_tokens``) rather than estimated from words."""
    from PIL import Image

    from balcaprl.data.format import read_split_rows
    from balcaprl.plan.memory import PROMPT_TEXT_TOKENS, model_shape
    from balcaprl.train.modeling import ImageGrid

    shape = model_shape(recipe.model.path)
    image = recipe.model.image
    grid = None
    if shape.fixed_image_tokens is None:
        factor = shape.patch * shape.merge
        grid = ImageGrid(
            factor, image.min_pixels or 4 * factor**2, image.max_pixels or shape.default_max_pixels
        )
    cap = recipe.rollout.max_caption_tokens
    out, counted = [], True
    for row in read_split_rows(dataset_dir, split):
        if grid is None:
            tokens = shape.image_tokens(None)
        else:
            with Image.open(Path(dataset_dir) / row["image"]) as img:  # the header only
                tokens = grid.tokens(*img.size)
        caption = row.get("reference_tokens")
        if caption is None:
            counted = False
            caption = round(WORD_TOKENS * len(str(row["reference"]).split()))
        out.append(Lengths(tokens + PROMPT_TEXT_TOKENS, min(int(caption), cap)))
    return out, counted


def expected_share(dataset_dir: Path | str, recipe, gpus: int) -> TokenShare:
    """The real-token share of ``recipe``'s padded micro-batches on ``dataset_dir`` over ``gpus`` processes."""
    lengths, counted = dataset_lengths(dataset_dir, recipe)
    per_process = max(1, recipe.train.prompts_per_batch // gpus)
    share = padded_batches(lengths, per_process, recipe.rollout.rollouts_per_prompt)
    return TokenShare(share.real, share.padded, share.rows, counted)


def main(argv: list[str] | None = None) -> int:
    """``python -m balcaprl.plan.token_share DATA RECIPE OUT.json``: the prepared data's
    ``[[prompt, caption], ...]`` token counts (the length mix ``benchmarks/gpu_check.py --lengths`` and
    ``benchmarks/gpu_step.py --lengths`` take)."""
    import json
    import sys

    from balcaprl.recipe import load_recipe

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print(main.__doc__.split("\n")[0].strip(), file=sys.stderr)
        return 2
    lengths, counted = dataset_lengths(args[0], load_recipe(args[1]))
    Path(args[2]).write_text(json.dumps([[s.prompt, s.caption] for s in lengths]) + "\n", encoding="utf-8")
    print(
        f"wrote {len(lengths)} samples' lengths to {args[2]} (captions {'counted' if counted else 'estimated'})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
