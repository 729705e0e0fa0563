"""A probe of the world's incentives at the RL start: what the rewards and the two estimators make of
groups of rollouts, before any training.

Given groups of captions (each group: one scene, its reference, G captions), :func:`probe_groups`
judges every caption with the oracle (training rubric, the recipe's length mask) and measures what
decides whether the paper's ablations can show anything:

- how many captions fall outside the length band [tau_l, tau_u] on each side (the mask must have
  something to gate, from below and from above);
- how many are terse: shorter than tau_l x the reference and nothing but true (a short caption that
  scores well on precision, the temptation the lower bound exists for);
- the within-group correlation of precision and recall (one signal, or two that trade off?);
- the correlation of c-GDPO's and GRPO's advantages (do the estimators differ at all?);
- each reward's share of the summed within-group variance GRPO normalises by (balanced shares leave
  Proposition 1 nothing to bite on).

:func:`stand_in_groups` draws groups from the SFT target distribution (``sft_target``): what the SFT
policy is trained to imitate, so a cheap stand-in for SFT rollouts in tests (the real policy is a
blurred copy of it). :func:`policy_groups` samples the groups from a real policy instead
(``balcaprl synthetic probe``); :func:`save_groups` keeps such a sample (``--save``), so a test can
probe real SFT rollouts in seconds (``tests/synthetic/data/sft_rollouts.jsonl``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from balcaprl.advantages import c_gdpo_advantages, grpo_advantages
from balcaprl.rewards import RewardConfig, score_rollout
from balcaprl.synthetic.captioners import sft_target
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.lexicon import words_of
from balcaprl.synthetic.oracle import oracle_verdict
from balcaprl.synthetic.scenes import Scene


@dataclass(frozen=True)
class Group:
    scene: Scene
    reference: str
    captions: tuple[str, ...]


@dataclass(frozen=True)
class ProbeTable:
    """The probe's rollouts, one row each, for intervals that resample prompts (a group is one prompt,
    so its rollouts are resampled together): group index, rewards less their group's mean (P, R, L),
    length less its group's mean, and each estimator's advantage (a group's advantages depend only on
    its own rollouts, so they need no recomputing)."""

    groups: np.ndarray
    within: np.ndarray
    within_length: np.ndarray
    c_gdpo: np.ndarray
    grpo: np.ndarray

    def interval(
        self,
        statistic: Callable[[ProbeTable], float],
        samples: int = 2000,
        level: float = 0.95,
        seed: int = 0,
    ) -> tuple[float, float]:
        """Percentile bootstrap interval of ``statistic`` over prompts (groups drawn with replacement)."""
        rng = np.random.default_rng(seed)
        ids = np.unique(self.groups)
        rows_of = [np.flatnonzero(self.groups == g) for g in ids]
        values = []
        for _ in range(samples):
            pick = np.concatenate([rows_of[i] for i in rng.integers(0, len(ids), len(ids))])
            values.append(statistic(self.subset(pick)))
        tail = (1 - level) / 2
        low, high = np.nanquantile(values, [tail, 1 - tail])
        return float(low), float(high)

    def subset(self, rows: np.ndarray) -> ProbeTable:
        return ProbeTable(
            self.groups[rows], self.within[rows], self.within_length[rows], self.c_gdpo[rows], self.grpo[rows]
        )

    def advantage_corr(self) -> float:
        return _corr(self.c_gdpo, self.grpo)

    def length_corr(self, k: int) -> float:
        return _corr(self.within[:, k], self.within_length)


# The pre-flight checks' thresholds (tests/synthetic/test_world_temptations.py), each from a principle,
# none from a measured value. A batch of the demo is 8 prompts x 8 rollouts: a mechanism that acts on a
# kind of rollout acts in an average batch only if that kind is at least 1 in 64 of the rollouts.
ONE_PER_BATCH = 1 / 64


@dataclass(frozen=True)
class WorldProbe:
    n_captions: int
    below_band_share: float  # rho < tau_l
    above_band_share: float  # rho > tau_u
    terse_share: float  # rho < tau_l and precision 1
    mean_ratio: float
    precision_recall_corr: float  # within groups (group means removed)
    advantage_corr: float  # c-GDPO vs GRPO advantages over all rollouts
    variance_shares: tuple[float, float, float]  # (P, R, L) shares of sum_k Var(w_k r_k) within groups
    length_corr: tuple[float, float, float]  # within-group correlation of each reward with length
    table: ProbeTable = field(compare=False, repr=False)  # the rollouts, for intervals over prompts

    @property
    def noise_bound(self) -> float:
        """A pooled within-group correlation of N rollouts in G groups has N - G - 1 degrees of freedom;
        with no relation at all it falls within +-1.96 / sqrt(N - G - 1) 95% of the time (Fisher)."""
        return 1.96 / math.sqrt(self.n_captions - len(np.unique(self.table.groups)) - 1)

    def failed_checks(self, *, upper_side: bool = True) -> list[str]:
        """The pre-flight checks this start fails, by name: terse captions, captions below and (with
        ``upper_side``) above the band each at least one per batch; precision falling and recall rising
        with length past the noise bound; the c-GDPO/GRPO advantage correlation's 95% interval over
        prompts below 1."""
        p_len, r_len, _ = self.length_corr
        checks = {
            "terse": self.terse_share >= ONE_PER_BATCH,
            "below": self.below_band_share >= ONE_PER_BATCH,
            "above": not upper_side or self.above_band_share >= ONE_PER_BATCH,
            "P-length": p_len < -self.noise_bound,
            "R-length": r_len > self.noise_bound,
            "corr < 1": self.table.interval(lambda t: t.advantage_corr())[1] < 1.0,
        }
        return [name for name, passed in checks.items() if not passed]


def _within(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``values`` less their group's mean."""
    out = values.astype(np.float64).copy()
    for g in np.unique(groups):
        out[groups == g] -= out[groups == g].mean(axis=0)
    return out


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def probe_groups(groups: Sequence[Group], config: RewardConfig | None = None) -> WorldProbe:
    """Judge every caption of ``groups`` and measure the world's incentives (see the module docstring).
    ``config``: the rewards (default: Table 3's equal weights 0.3 / 0.3 / 0.3 with the length mask)."""
    if config is None:
        config = RewardConfig(weights={"precision": 0.3, "recall": 0.3, "linguistic": 0.3})
    rows, lengths, ratios, index = [], [], [], []
    for g, group in enumerate(groups):
        ref_tokens = len(words_of(group.reference))
        for caption in group.captions:
            tokens = len(words_of(caption))
            verdict = oracle_verdict(group.scene, caption, group.reference, "training")
            score = score_rollout(verdict, config, tokens, ref_tokens)
            rows.append(score.as_tuple())
            lengths.append(tokens)
            ratios.append(tokens / ref_tokens)
            index.append(g)
    rewards = np.asarray(rows)
    group_index = np.asarray(index)
    ratio = np.asarray(ratios)
    weights = config.weights.as_list()
    within = _within(rewards, group_index)
    within_length = _within(np.asarray(lengths, dtype=np.float64), group_index)
    weighted_var = (within * np.asarray(weights)) ** 2
    total = weighted_var.sum()  # 0 when every group's captions score alike: no shares to give
    shares = weighted_var.sum(axis=0) / total if total > 0 else np.full(3, np.nan)
    tensor = torch.tensor(rewards, dtype=torch.float64)
    c_gdpo = c_gdpo_advantages(tensor, group_index.tolist(), weights).numpy()
    grpo = grpo_advantages(tensor, group_index.tolist(), weights).numpy()
    return WorldProbe(
        n_captions=len(rows),
        below_band_share=float((ratio < config.length.tau_low).mean()),
        above_band_share=float((ratio > config.length.tau_high).mean()),
        terse_share=float(((ratio < config.length.tau_low) & (rewards[:, 0] == 1.0)).mean()),
        mean_ratio=float(ratio.mean()),
        precision_recall_corr=_corr(within[:, 0], within[:, 1]),
        advantage_corr=_corr(c_gdpo, grpo),
        variance_shares=tuple(float(s) for s in shares),  # type: ignore[arg-type]
        length_corr=tuple(_corr(within[:, k], within_length) for k in range(3)),  # type: ignore[arg-type]
        table=ProbeTable(group_index, within, within_length, c_gdpo, grpo),
    )


def stand_in_groups(
    scenes: Sequence[Scene], rng: random.Random, *, rollouts: int = 8, flawed_fraction: float = 0.5
) -> list[Group]:
    """One group per scene: its re-captioned reference and ``rollouts`` SFT targets (``sft_target``)."""
    return [
        Group(
            scene,
            reference_caption(scene, rng),
            tuple(sft_target(scene, rng, flawed_fraction) for _ in range(rollouts)),
        )
        for scene in scenes
    ]


def policy_groups(
    policy_dir: Path | str,
    data_dir: Path | str,
    *,
    prompts: int = 48,
    rollouts: int = 8,
    temperature: float = 0.7,
    max_new_tokens: int = 192,
    seed: int = 0,
    split: str = "train",
    reference: str = "reference",
) -> list[Group]:
    """``rollouts`` sampled captions of the policy in ``policy_dir`` for each of the first ``prompts``
    images of ``split`` (seeded): a group per image, with its ``reference`` column."""
    import torch
    from PIL import Image

    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.oracle import SCENES_FILE
    from balcaprl.synthetic.policy import generate_captions, load_policy

    if prompts < 1 or rollouts < 1:
        raise ValueError(f"need prompts >= 1 and rollouts >= 1, got {prompts} and {rollouts}")
    rows = read_split_rows(data_dir, split)[:prompts]
    with (Path(data_dir) / SCENES_FILE).open() as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    scenes = {r["id"]: Scene.from_dict(r["scene"]) for r in records}
    model, processor = load_policy(policy_dir)
    images = [Image.open(r["image_path"]).convert("RGB") for r in rows for _ in range(rollouts)]
    torch.manual_seed(seed)
    captions = generate_captions(
        model, processor, images, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature
    )
    return [
        Group(
            scenes[row["id"]],
            row[reference] or row["reference"],
            tuple(captions[i * rollouts : (i + 1) * rollouts]),
        )
        for i, row in enumerate(rows)
    ]


def save_groups(groups: Sequence[Group], path: Path | str, **meta: object) -> Path:
    """Write ``groups`` as JSON lines: a header (``meta``, plus the world's generator version, which
    :func:`load_groups` checks), then one group per line."""
    from balcaprl.files import atomic_write_text
    from balcaprl.synthetic.build import GENERATOR_VERSION

    header = {"generator_version": GENERATOR_VERSION, **meta}
    lines = [json.dumps(header, sort_keys=True)]
    lines += [
        json.dumps({"scene": g.scene.to_dict(), "reference": g.reference, "captions": list(g.captions)})
        for g in groups
    ]
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
    return Path(path)


def load_groups(path: Path | str) -> tuple[dict, list[Group]]:
    """The header and groups :func:`save_groups` wrote; a sample from another version of the world is
    refused (its captions were sampled from a policy trained on other targets)."""
    from balcaprl.synthetic.build import GENERATOR_VERSION

    header, *rows = (json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line)
    if header.get("generator_version") != GENERATOR_VERSION:
        raise ValueError(
            f"{path}: sampled in world version {header.get('generator_version')}, this is version "
            f"{GENERATOR_VERSION}; sample it again ({header.get('command', 'balcaprl synthetic probe --save')})"
        )
    groups = [Group(Scene.from_dict(r["scene"]), r["reference"], tuple(r["captions"])) for r in rows]
    return header, groups
