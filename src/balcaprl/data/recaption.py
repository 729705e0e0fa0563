"""`balcaprl data recaption`: new reference captions from a strong model, through the judge's machinery.

The paper re-captions ShareGPT4V with GPT-5-mini, reusing each sample's original captioning prompt;
better references beat the originals (Table 3, "w/o recap"). Per row:

    image + original prompt --(recaption rubric, judge endpoint)--> new ``reference``

Rubrics (``RECAPTION_RUBRICS``): ``paper`` (the default) sends the original prompt as the whole
instruction, nothing added; ``strict`` puts it under a system message asking for pointable-only
descriptions (no feelings, relationships, composition, mood or symbolism), a deliberate departure
that removes the route by which non-pointable inferences earn recall (docs/rubrics.md).
    ``reference_original`` keeps the original; a failed call keeps the original as ``reference``.

Everything about the call comes from ``balcaprl.judge`` (nothing of it is rewritten here): the judge
config (endpoint, API-key variable, concurrency, rate limits, timeouts, retries, sampling,
``max_image_side``, cache path, prices) and :class:`~balcaprl.judge.calls.JudgeCaller`, whose free-text
``call_text`` brings the HTTP session, the concurrency bound, the rate limiters, the sqlite cache, the
accounting (:class:`~balcaprl.judge.JudgeStats`) and the classification of failures into
:class:`~balcaprl.judge.JudgeFailure` reasons; :class:`~balcaprl.judge.images.ImageLoader`
(downscaling, hashing, refusing paths out of the dataset), the ``recaption`` rubric and
:func:`~balcaprl.judge.prompt.build_recaption_messages`. This module adds the dataset run.

Resuming: every finished call is appended at once to ``DIR/.recaption/progress.jsonl`` (id, the
call's cache key, caption or failure, tokens), and successful captions also go to the judge cache.
A re-run skips every row whose key already has a caption, so nothing paid for is asked again (at
most the ``concurrency`` calls in flight at the moment of an interruption are lost). Failures are
asked again on the next run. The dataset files are rewritten only at the end, card last.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from balcaprl.data.format import (
    SPLITS,
    DatasetSample,
    TokenCounter,
    write_dataset,
)
from balcaprl.errors import OutputError
from balcaprl.files import atomic_write_text, jsonl_lines
from balcaprl.progress import Progress

log = logging.getLogger("balcaprl.recaption")

WORK_DIR = ".recaption"
PROGRESS_FILE = "progress.jsonl"
FAILURES_FILE = "recaption_failures.jsonl"
_CARD_KEYS = {"name", "version", "counts", "tokenizer", "rejections"}  # written by write_dataset itself
# --rubric choice -> packaged rubric name (balcaprl.judge.rubrics)
RECAPTION_RUBRICS = {"paper": "recaption", "strict": "recaption_strict"}
_ABORT_AFTER = 16  # this many failures in a row before any success: the set-up is wrong, stop paying


@dataclass(frozen=True)
class RecaptionOutcome:
    """One row's result: ``caption`` or ``failure`` (a :class:`~balcaprl.judge.JudgeFailure`)."""

    caption: str | None
    failure: Any = None  # JudgeFailure | None
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Recaptioner:
    """Image + original prompt -> a reference caption, from the endpoint of a judge config.

    ``model`` overrides the config's model (re-captioning uses a stronger model than judging).
    ``rubric``: a key of ``RECAPTION_RUBRICS`` (``paper``: the original prompt alone; ``strict``).
    ``image_root``: image paths are resolved inside it. ``cache``: a ``JudgeCache`` to share, else
    the config's ``cache_path`` (none when that is null). Use ``async with``.
    """

    def __init__(
        self,
        config: Any,
        *,
        image_root: Path | str,
        model: str | None = None,
        rubric: str = "paper",
        cache: Any = None,
        http_client: Any = None,
    ) -> None:
        from balcaprl.judge.calls import JudgeCaller
        from balcaprl.judge.rubrics import load_rubric

        if rubric not in RECAPTION_RUBRICS:
            raise ValueError(
                f"unknown re-caption rubric {rubric!r}; choose one of {', '.join(RECAPTION_RUBRICS)}"
            )
        self.config = config.model_copy(update={"model": model}) if model else config
        self.rubric = load_rubric(RECAPTION_RUBRICS[rubric])
        self.caller = JudgeCaller(self.config, cache=cache, image_root=image_root, http_client=http_client)
        self.images = self.caller.images
        self.cache = self.caller.cache
        self.stats = self.caller.stats

    @property
    def model(self) -> str:
        return self.config.model

    async def __aenter__(self) -> Recaptioner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.caller.aclose()

    def _identity(self, image_sha256: str, prompt: str) -> dict[str, Any]:
        return {
            "rubric_version": self.rubric.version,
            "image_sha256": image_sha256,
            "max_image_side": self.config.max_image_side,
            "prompt": prompt,
        }

    def key(self, image_sha256: str, prompt: str) -> str:
        """The cache key of one call: everything that changes the answer."""
        identity = self._identity(image_sha256, prompt)
        return self.caller.key("recaption", identity=identity, temperature=self.config.temperature)

    async def recaption(
        self, image: Path | str, prompt: str, image_sha256: str | None = None
    ) -> tuple[str, RecaptionOutcome]:
        """``(cache key, outcome)`` for one image; never raises for a failed call (only for a broken
        configuration: :class:`~balcaprl.judge.JudgeConfigError`). ``image_sha256``, when known,
        lets a cached caption be returned without reading the image."""
        from balcaprl.judge import JudgeFailure
        from balcaprl.judge.images import ImageError
        from balcaprl.judge.prompt import build_recaption_messages

        if image_sha256 is not None:  # known: the cache can answer without loading the image
            key = self.key(image_sha256, prompt)
            text = self.caller.cached_text(key)
            if text is not None:
                self.stats.requests += 1
                self.stats.cache_hits += 1
                return key, RecaptionOutcome(text, cached=True)
        try:
            prepared = await asyncio.to_thread(self.images.load, image)
        except ImageError as error:
            self.stats.requests += 1
            self.stats.rejected += 1
            return "", RecaptionOutcome(None, JudgeFailure("bad_input", str(error)[:300]))
        result = await self.caller.call_text(
            build_recaption_messages(self.rubric, prepared, prompt),
            kind="recaption",
            identity=self._identity(prepared.sha256, prompt),
            temperature=self.config.temperature,
        )
        return result.key, RecaptionOutcome(
            result.value,
            result.failure,
            cached=result.cached,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
        )


# --------------------------------------------------------------------------------------------------
# The dataset run


@dataclass
class RecaptionReport:
    out: Path
    model: str
    rubric_version: str
    rows: int = 0
    requested: int = 0  # rows asked for in this run (all, or --limit)
    recaptioned: int = 0  # rows whose reference is now the model's caption
    from_progress: int = 0  # of those, finished by an earlier (interrupted) run
    from_cache: int = 0
    failed: Counter = field(default_factory=Counter)  # reason -> rows that kept the original
    failure_details: dict[str, str] = field(default_factory=dict)  # reason -> the first one's detail
    calls: int = 0  # paid calls made in this run
    prompt_tokens: int = 0  # this run
    completion_tokens: int = 0
    cost_usd: float | None = None  # this run, when the config has prices
    total_prompt_tokens: int = 0  # every call behind the current references, earlier runs included
    total_completion_tokens: int = 0
    total_cost_usd: float | None = None
    tokenizer: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)


class _CallLog:
    """``DIR/.recaption/progress.jsonl``: one line per finished call, appended and flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[tuple[str, str], dict[str, Any]] = {}  # (id, key) -> the latest record
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # a line cut by an interruption
                data = data[: data.rfind(b"\n") + 1]
                with path.open("r+b") as handle:
                    handle.truncate(len(data))
            for record in self.records(data):
                self.done[(record["id"], record["key"])] = record
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("a", encoding="utf-8")

    @staticmethod
    def records(data: bytes) -> Iterator[dict[str, Any]]:
        """The readable records of a progress file's bytes (a cut or foreign line is skipped)."""
        for line in jsonl_lines(data.decode("utf-8", errors="replace")):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "id" in record and "key" in record:
                yield record

    def caption(self, sample_id: str, key: str) -> dict[str, Any] | None:
        record = self.done.get((sample_id, key))
        return record if record and record.get("caption") else None

    def add(self, record: dict[str, Any]) -> None:
        self.done[(record["id"], record["key"])] = record
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()


def recaption_results(root: Path) -> list[str]:
    """What in a dataset folder is the result of an earlier re-captioning (finished or not).

    The progress file counts once it holds a caption: failures are asked again by any run, so a
    run that failed before its first answer (no key, no route to the endpoint) never blocks its own
    retry."""
    root = Path(root)
    progress = root / WORK_DIR / PROGRESS_FILE
    found = [f"{WORK_DIR}/{PROGRESS_FILE}"] if _holds_a_caption(progress) else []
    try:
        card = json.loads((root / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        card = {}
    recorded = card.get("recaption") if isinstance(card, dict) else None
    if isinstance(recorded, dict) and recorded.get("recaptioned", 1):  # a run that re-captioned none: nothing
        found.append(f"dataset.json: {card['recaption'].get('recaptioned', '?')} re-captioned references")
    return found


def _holds_a_caption(progress: Path) -> bool:
    if not progress.is_file():
        return False
    return any(record.get("caption") for record in _CallLog.records(progress.read_bytes()))


def _load_card(root: Path) -> dict[str, Any]:
    """The dataset's card, or the copy kept while an interrupted rewrite was under way."""
    card, stash = root / "dataset.json", root / WORK_DIR / "card.json"
    if card.is_file():
        return json.loads(card.read_text())
    if stash.is_file():
        return json.loads(stash.read_text())
    from balcaprl.data.format import read_card

    return read_card(root)  # raises the format's "not a finished dataset" error


class _Run:
    """One pass over the rows: each row's caption comes from the progress file, or from a call."""

    def __init__(
        self,
        recaptioner: Recaptioner,
        store: _CallLog,
        report: RecaptionReport,
        on_result: Callable[[str, RecaptionOutcome], None] | None,
    ) -> None:
        self.recaptioner, self.store, self.report, self.on_result = recaptioner, store, report, on_result
        self.captions: dict[str, dict[str, Any]] = {}  # id -> progress record with the caption
        self.failures: dict[str, Any] = {}  # id -> JudgeFailure
        self.successes = 0
        self.failures_in_a_row = 0

    async def all(self, rows: list[dict[str, Any]], workers: int, progress: bool) -> None:
        queue = iter(rows)  # shared by the workers: each row is taken once
        description = f"re-captioning with {self.recaptioner.model}"
        async with self.recaptioner:
            with Progress(description, total=len(rows), unit="rows", enabled=progress) as bar:

                async def worker() -> None:
                    for row in queue:
                        outcome = await self.one(row)
                        bar.advance()
                        if outcome.failure is not None:
                            bar.status = f"{len(self.failures)} failed (kept the original)"
                        if self.on_result is not None:
                            self.on_result(row["id"], outcome)

                try:
                    async with asyncio.TaskGroup() as group:
                        for _ in range(workers):
                            group.create_task(worker())
                except BaseExceptionGroup as errors:
                    raise errors.exceptions[0] from None

    async def one(self, row: dict[str, Any]) -> RecaptionOutcome:
        from balcaprl.judge import JudgeConfigError

        recaptioner, sample_id = self.recaptioner, row["id"]
        done = self.store.caption(sample_id, recaptioner.key(row["image_sha256"], row["prompt"]))
        if done is not None:  # finished by an earlier, interrupted run
            self.report.from_progress += 1
            self.captions[sample_id] = done
            return RecaptionOutcome(done["caption"], cached=True)
        key, outcome = await recaptioner.recaption(row["image"], row["prompt"], row["image_sha256"])
        record = {
            "id": sample_id,
            "key": key,
            "caption": outcome.caption,
            "failure": None if outcome.failure is None else [outcome.failure.reason, outcome.failure.detail],
            "model": recaptioner.model,
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
        }
        self.store.add(record)
        if outcome.failure is None:
            self.captions[sample_id] = record
            self.report.from_cache += outcome.cached
            self.successes += 1
            return outcome
        self.failures[sample_id] = outcome.failure
        self.failures_in_a_row = 0 if self.successes else self.failures_in_a_row + 1
        if self.failures_in_a_row >= _ABORT_AFTER:
            raise JudgeConfigError(
                f"the first {self.failures_in_a_row} re-caption calls all failed, e.g. "
                f"{outcome.failure.reason}: {outcome.failure.detail}; fix the judge config (model "
                f"{recaptioner.model!r}; reasoning models such as gpt-5-mini need `temperature: null`) "
                "and run again"
            )
        return outcome


def recaption_dataset(
    data_dir: Path | str,
    judge_config: Any,
    *,
    model: str | None = None,
    rubric: str = "paper",
    limit: int | None = None,
    tokenizer: str | None = None,
    cache_path: Path | str | None = None,
    no_cache: bool = False,
    http_client: Any = None,
    on_result: Callable[[str, RecaptionOutcome], None] | None = None,
    progress: bool = False,
    restart: bool = False,
) -> RecaptionReport:
    """Re-caption the references of ``data_dir`` in place; see the module docstring.

    ``restart``: forget the progress of earlier runs (every row is asked again; ``--overwrite``).

    ``judge_config``: a ``JudgeConfig``, a YAML path or a mapping. ``rubric``: ``paper`` (the
    original prompt alone, the default) or ``strict`` (pointable-only). ``tokenizer``: recount
    ``reference_tokens`` with it (default: the card's tokenizer). ``on_result(id, outcome)`` is
    called as each row finishes (progress bars, tests). Raises ``JudgeConfigError`` for a config
    the endpoint rejects, and when the first calls all fail the same way.
    """
    from balcaprl.judge import JudgeConfig, load_judge_config
    from balcaprl.judge.throughput import calls_in_flight

    root = Path(data_dir).expanduser().resolve()
    card = _load_card(root)
    cfg = judge_config if isinstance(judge_config, JudgeConfig) else load_judge_config(judge_config)
    if cache_path is not None:
        cfg = cfg.model_copy(update={"cache_path": Path(cache_path).expanduser()})
    if no_cache:
        cfg = cfg.model_copy(update={"cache_path": None})
    rows = {split: pq.read_table(root / f"{split}.parquet").to_pylist() for split in SPLITS}
    ordered = [row for split in SPLITS for row in rows[split]]
    for row in ordered:  # the original is kept once, before anything replaces `reference`
        if row["reference_original"] is None:
            row["reference_original"] = row["reference"]
    wanted = ordered if limit is None else ordered[:limit]

    # Before anything is written: a missing API key or a bad config leaves no progress file behind.
    recaptioner = Recaptioner(cfg, image_root=root, model=model, rubric=rubric, http_client=http_client)
    work = root / WORK_DIR
    try:  # before any call: a dataset folder that cannot be written is found now, not after paying
        work.mkdir(exist_ok=True)
        stash = work / "card.json"
        if (root / "dataset.json").is_file():
            shutil.copyfile(root / "dataset.json", stash)
        if restart:
            (work / PROGRESS_FILE).unlink(missing_ok=True)
        store = _CallLog(work / PROGRESS_FILE)
    except OSError as error:
        raise OutputError(
            f"--data {root}: cannot write there ({error.strerror or error}); the dataset is rewritten in "
            "place, so it must be writable"
        ) from None
    report = RecaptionReport(
        out=root,
        model=recaptioner.model,
        rubric_version=recaptioner.rubric.version,
        rows=len(ordered),
        requested=len(wanted),
    )
    run = _Run(recaptioner, store, report, on_result)
    try:
        asyncio.run(
            run.all(
                wanted,
                workers=max(1, min(calls_in_flight(cfg, cfg.timeout_s), len(wanted))),
                progress=progress,
            )
        )
    finally:
        store.close()
    captions, failures = run.captions, run.failures

    # Rows outside --limit keep a caption an earlier run made with the same model and rubric.
    for row in ordered[len(wanted) :]:
        if row["image_sha256"]:
            done = store.caption(row["id"], recaptioner.key(row["image_sha256"], row["prompt"]))
            if done is not None:
                captions[row["id"]] = done

    stats = recaptioner.stats
    prices = cfg.price_per_million_tokens
    report.calls = stats.calls
    report.prompt_tokens, report.completion_tokens = stats.prompt_tokens, stats.completion_tokens
    report.cost_usd = stats.cost_usd(prices)
    report.failed = Counter(f.reason for f in failures.values())
    for failure in failures.values():  # the terminal shows each reason's cause, not only the file
        report.failure_details.setdefault(failure.reason, failure.detail)
    report.recaptioned = len(captions)
    report.total_prompt_tokens = sum(int(c.get("prompt_tokens") or 0) for c in captions.values())
    report.total_completion_tokens = sum(int(c.get("completion_tokens") or 0) for c in captions.values())
    if prices is not None:
        report.total_cost_usd = (
            report.total_prompt_tokens * prices.prompt + report.total_completion_tokens * prices.completion
        ) / 1e6
    report.stats = stats.as_dict(prices)

    counter = _token_counter(tokenizer or card.get("tokenizer"))
    report.tokenizer = counter.name if counter else None
    atomic_write_text(
        root / FAILURES_FILE,
        "".join(
            json.dumps({"id": i, "reason": f.reason, "detail": f.detail}, ensure_ascii=False) + "\n"
            for i, f in failures.items()
        ),
    )

    def samples(split: str) -> Iterator[DatasetSample]:
        for row in rows[split]:
            done = captions.get(row["id"])
            yield DatasetSample(
                id=row["id"],
                image=root / row["image"],
                image_sha256=row["image_sha256"],
                prompt=row["prompt"],
                reference=done["caption"] if done else row["reference_original"],
                reference_original=row["reference_original"],
                source=row["source"],
            )

    extra = {k: v for k, v in card.items() if k not in _CARD_KEYS}
    extra["recaption"] = {
        "model": recaptioner.model,
        "rubric": recaptioner.rubric.name,
        "rubric_version": recaptioner.rubric.version,
        "max_image_side": cfg.max_image_side,
        "temperature": cfg.temperature,
        "rows": report.rows,
        "recaptioned": report.recaptioned,
        "failed": sum(report.failed.values()),
        "failures": dict(report.failed),
        "not_requested": report.rows - report.requested,
        "limit": limit,
        "prompt_tokens": report.total_prompt_tokens,
        "completion_tokens": report.total_completion_tokens,
        "estimated_cost_usd": report.total_cost_usd,
        "failures_file": FAILURES_FILE,
    }
    write_dataset(
        root,
        samples("train"),
        samples("eval"),
        name=card["name"],
        version=card.get("version", "1"),
        token_counter=counter,
        rejections=card.get("rejections"),
        extra=extra,
    )
    stash.unlink(missing_ok=True)
    return report


def _token_counter(name: str | None) -> TokenCounter | None:
    if not name:
        return None
    try:
        return TokenCounter.load(name)
    except ValueError as error:
        log.warning("reference_tokens left empty: %s (the trainer recounts them)", error)
        return None
