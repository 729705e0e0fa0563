"""`balcaprl judge audit`: re-judge a sample of captions and measure how far to trust each judge.

    items = read_audit_items(dataset, captions, sample=1000, seed=0)
    report = run_audit(items, [("gpt", make_a), ("local", make_b)], reference=("oracle", make_oracle))

Runs, in order: the reference judge once (when there is one), each judge once, and each judge a
second time when ``retest`` is set (the default with one judge). Judges are built fresh for every
run (a factory per judge) and the CLI builds them with the cache off, so a second run is a real
second judgement with the judge's own sampling settings. Comparisons:

- ``judges``: every pair of judges (first runs): agreement and kappa per flag, correlations per
  reward and for b-CapScore, rank agreement of the b-CapScores;
- ``retest``: a judge's two runs: the same figures, and each reward's test-retest noise;
- ``reference``: each judge's first run against the reference judge: its error rate per flag.

Every run also reports its failures by reason and, where the judge keeps accounting (the
OpenAI-compatible client), tokens, calls and estimated USD per 1,000 rollouts.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError
from balcaprl.judge.audit.compare import compare_outcomes, item_scores
from balcaprl.judge.protocol import (
    Judge,
    JudgeFailure,
    Judgement,
    JudgeOutcome,
    JudgeRequest,
    Rubric,
    SendableRequests,
    sendable_requests,
)

JudgeFactory = Callable[[], Judge]
PER = 1000  # accounting is reported per this many rollouts


@dataclass(frozen=True)
class AuditItem:
    """One caption to re-judge: its dataset row id, image file, caption and the row's reference."""

    key: str
    image: str
    caption: str
    reference: str


def read_audit_items(
    dataset: Path | str,
    captions: Path | str,
    *,
    sample: int | None = None,
    seed: int = 0,
    reference_column: str = "reference",
) -> list[AuditItem]:
    """The captions of ``captions`` (a caption file as `balcaprl score` reads it) matched to rows of
    the dataset folder (either split) by row id, by image path relative to the dataset, or by the
    image's absolute path; then a seeded sample of ``sample`` of them, in file order."""
    from balcaprl.data.format import read_split_rows
    from balcaprl.evaluate.score import read_caption_file

    root = Path(dataset)
    try:
        rows = [row for split in ("train", "eval") for row in read_split_rows(root, split)]
    except FileNotFoundError as error:
        raise InputError(f"--data {root}: {error}") from None
    by_name: dict[str, dict[str, Any]] = {}
    for row in rows:
        for name in (str(row["id"]), row["image"], str(Path(row["image_path"]).resolve())):
            by_name.setdefault(name, row)
    items, unknown = [], []
    for name, caption in read_caption_file(Path(captions), keys=("caption",)):
        row = by_name.get(name) or by_name.get(str(Path(name).resolve()))
        if row is None:
            unknown.append(name)
            continue
        image = str(
            Path(row["image_path"]).resolve()
        )  # absolute: judges resolve relative paths their own way
        items.append(AuditItem(str(row["id"]), image, caption, row[reference_column] or ""))
    if unknown:
        raise InputError(
            f"{captions}: {len(unknown)} caption(s) name no row of {root} (by id or image path), e.g. "
            f"{', '.join(repr(u) for u in unknown[:3])}"
        )
    if not items:
        raise InputError(f"{captions} holds no captions")
    if sample is not None and sample < len(items):
        chosen = sorted(random.Random(seed).sample(range(len(items)), sample))
        items = [items[i] for i in chosen]
    return items


def judge_names(configs: Sequence[Path | str], taken: Collection[str] = ()) -> list[str]:
    """Names for judges given by their config files: each file's stem (``configs/gpt.yaml``: ``gpt``).

    A stem that another judge's stem or a name in ``taken`` (the reference judge's, ``oracle``)
    already has is lengthened, one path part at a time, to the shortest tail of the path as given
    that is free: ``oracle.yaml`` beside the reference ``oracle``; ``a/judge.yaml`` and
    ``b/judge.yaml`` for two ``judge.yaml``. Where the whole path is not free (the same file twice),
    the stem is numbered: ``judge-1``, ``judge-2``.
    """
    paths = [Path(c) for c in configs]
    tails = [[p.stem] + [Path(*p.parts[-k:]).as_posix() for k in range(1, len(p.parts) + 1)] for p in paths]
    level = [0] * len(paths)

    def clashing(names: list[str]) -> list[int]:
        return [i for i, name in enumerate(names) if name in taken or names.count(name) > 1]

    while True:
        names = [tails[i][level[i]] for i in range(len(paths))]
        longer = [i for i in clashing(names) if level[i] + 1 < len(tails[i])]
        if not longer:
            break
        for i in longer:
            level[i] += 1
    stuck = clashing(names)
    for i in stuck:
        names[i] = paths[i].stem
    used = set(taken) | {name for i, name in enumerate(names) if i not in stuck}
    for i in stuck:
        number = 2 if paths[i].stem in taken else 1
        while f"{paths[i].stem}-{number}" in used:
            number += 1
        names[i] = f"{paths[i].stem}-{number}"
        used.add(names[i])
    return names


@dataclass
class _Run:
    judge: str
    repeat: int
    outcomes: list[JudgeOutcome]
    accounting: dict[str, Any] | None
    seconds: float

    def figures(self) -> dict[str, Any]:
        failures = Counter(o.reason for o in self.outcomes if isinstance(o, JudgeFailure))
        out: dict[str, Any] = {
            "judge": self.judge,
            "repeat": self.repeat,
            "items": len(self.outcomes),
            "judged": sum(isinstance(o, Judgement) for o in self.outcomes),
            "failures": dict(sorted(failures.items())),
            "seconds": round(self.seconds, 3),
            "accounting": self.accounting,
            "per_1000": None,
        }
        a = self.accounting
        if a and a.get("requests"):
            scale = PER / a["requests"]
            cost = a.get("estimated_cost_usd")
            out["per_1000"] = {
                "prompt_tokens": a["prompt_tokens"] * scale,
                "completion_tokens": a["completion_tokens"] * scale,
                "calls": a["calls"] * scale,
                "cost_usd": None if cost is None else cost * scale,
            }
        return out


async def _judge(judge: Judge, requests: list[JudgeRequest], on_outcome) -> tuple[list[JudgeOutcome], Any]:
    try:
        if hasattr(judge, "judge_batch_with_stats"):  # the OpenAI-compatible client keeps accounting
            result = await judge.judge_batch_with_stats(requests, on_outcome=on_outcome)
            prices = getattr(getattr(judge, "config", None), "price_per_million_tokens", None)
            return result.outcomes, result.stats.as_dict(prices)
        outcomes = list(await judge.judge_batch(requests))
        if on_outcome is not None:
            for i, outcome in enumerate(outcomes):
                on_outcome(i, outcome)
        return outcomes, None
    finally:
        close = getattr(judge, "aclose", None)
        if close is not None:
            await close()


def _run(name: str, repeat: int, make: JudgeFactory, batch: SendableRequests, on_progress) -> _Run:
    total = len(batch.sent) + len(batch.refused)
    on_outcome = None if on_progress is None else (lambda i, o: on_progress(name, repeat, total))
    start = time.perf_counter()
    outcomes, accounting = asyncio.run(_judge(make(), batch.sent, on_outcome)) if batch.sent else ([], None)
    if len(outcomes) != len(batch.sent):
        raise RuntimeError(f"judge {name} returned {len(outcomes)} outcomes for {len(batch.sent)} requests")
    if on_progress is not None:
        for _ in batch.refused:  # refused before any call: they count as done
            on_progress(name, repeat, total)
    return _Run(name, repeat, batch.outcomes(outcomes), accounting, time.perf_counter() - start)


def run_audit(
    items: Sequence[AuditItem],
    judges: Sequence[tuple[str, JudgeFactory]],
    *,
    reference: tuple[str, JudgeFactory] | None = None,
    retest: bool | None = None,
    rubric: Rubric = "training",
    on_progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Judge ``items`` as the module docstring says; returns the report (JSON-ready) with per-item
    scores under ``"per_item"``. ``on_progress(judge, repeat, total)`` is called once per outcome."""
    if not judges:
        raise ValueError("an audit needs at least one judge")
    names = [name for name, _ in judges]
    if len(set(names)) != len(names) or (reference is not None and reference[0] in names):
        raise ValueError(  # the command names its judges with judge_names, which keeps them apart
            f"judge names must differ, got {names} and reference {reference and reference[0]}"
        )
    retest = len(judges) == 1 if retest is None else retest
    requests = [
        JudgeRequest(image=i.image, caption=i.caption, reference=i.reference, rubric=rubric) for i in items
    ]
    # an item whose caption, reference or image name is not valid Unicode fails as bad_input in every
    # run, never sent (a judge would see it cleaned): its row says why
    batch = sendable_requests(requests, [f"row {i.key!r}" for i in items])
    runs: list[_Run] = []
    if reference is not None:
        runs.append(_run(reference[0], 1, reference[1], batch, on_progress))
    for repeat in (1, 2) if retest else (1,):
        for name, make in judges:
            runs.append(_run(name, repeat, make, batch, on_progress))

    def first(name: str) -> _Run:
        return next(r for r in runs if r.judge == name and r.repeat == 1)

    comparisons = []
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            comparisons.append({"kind": "judges", "x": names[a], "y": names[b],
                                **compare_outcomes(first(names[a]).outcomes, first(names[b]).outcomes)})  # fmt: skip
    if retest:
        for name in names:
            again = next(r for r in runs if r.judge == name and r.repeat == 2)
            comparisons.append({"kind": "retest", "x": name, "y": name,
                                **compare_outcomes(first(name).outcomes, again.outcomes)})  # fmt: skip
    if reference is not None:
        truth = first(reference[0]).outcomes
        for name in names:
            comparisons.append({"kind": "reference", "x": reference[0], "y": name,
                                **compare_outcomes(truth, first(name).outcomes, reference=True)})  # fmt: skip
    per_item = []
    for index, item in enumerate(items):
        entry: dict[str, Any] = {"key": item.key, "image": item.image, "caption": item.caption, "runs": {}}
        for run in runs:
            outcome = run.outcomes[index]
            label = f"{run.judge}#{run.repeat}"
            entry["runs"][label] = (
                item_scores(outcome.verdict)
                if isinstance(outcome, Judgement)
                else {"failure": outcome.reason, "detail": outcome.detail}
            )
        per_item.append(entry)
    return {
        "items": len(items),
        "rubric": rubric,
        "judges": names,
        "reference": None if reference is None else reference[0],
        "retest": retest,
        "runs": [run.figures() for run in runs],
        "comparisons": comparisons,
        "per_item": per_item,
    }
