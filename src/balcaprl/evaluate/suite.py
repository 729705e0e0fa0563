"""`balcaprl evaluate`: run the chosen protocols on a model's captions and write one evaluation folder.

    OUT/eval.json              label, caption files, and per protocol: the headline score (the
                               paper's scale), its components, failures, missing items, settings,
                               judge model and accounting; ``headline`` collects Table 1's numbers
    OUT/<protocol>/items.jsonl per-item rows (b-CapScore: scores.jsonl + summary.json, as
                               `balcaprl score` writes them)

Every file is written atomically. ``eval.json`` is rewritten after each protocol, and a later run
into the same folder adds to it (run ``--suite caparena`` today and ``--suite dcscore`` tomorrow).
Judge calls go through the judge's sqlite cache, so an interrupted or repeated run pays only for
what is missing: the judge config's ``cache_path`` when it has one, else ``OUT/judge_cache.sqlite``.

The evaluation config (YAML, ``--config``; ``balcaprl.evaluate.config``) names the benchmark files
and, per protocol, an optional judge config and protocol settings; command-line flags override it.
Its ``official`` section names the benchmarks' own code, from which the official prompts are read
(and checked) before any call (:mod:`balcaprl.evaluate.official`). Each protocol's entry records the
prompts that ran and the options (``settings``), the benchmark rows refused while reading its file
(``refused``), and whether its number is comparable with the paper's Table 1
(``comparable_with_paper``, and ``not_comparable`` with the reasons when it is not).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError
from balcaprl.evaluate.config import PROTOCOLS, EvaluationConfig
from balcaprl.evaluate.formats import CaptionSet, read_caption_sets
from balcaprl.evaluate.official import departures, paper_comparability, scoring_rules
from balcaprl.evaluate.results import ProtocolResult
from balcaprl.files import atomic_write_text

EVAL_FILE = "eval.json"
# the headline figures of Table 1: name -> (protocol, metric)
HEADLINE = {
    "dcscore": ("dcscore", "dcscore"),
    "captionqa": ("captionqa", "score"),
    "caparena": ("caparena", "score"),
    "arena_length": ("caparena", "length_words"),
    "bcapscore": ("bcapscore", "b_capscore"),
}


# The folder's own record of paid judge answers when the shared cache is off (`evaluate --no-cache`):
# a judge cache that lives and dies with the evaluation folder, so --resume never pays twice.
ANSWER_RECORD = ".judge_record.sqlite"


def evaluation_results(out_dir: Path, protocols: Sequence[str]) -> list[str]:
    """The results of ``protocols`` that ``out_dir`` already holds (their folders or eval.json entries):
    what a new run of those protocols would replace (``balcaprl.outputs``)."""
    out_dir = Path(out_dir)
    found = [p for p in protocols if (out_dir / p).is_dir() and any((out_dir / p).iterdir())]
    try:
        recorded = read_eval(out_dir).get("results") or {}
    except (OSError, ValueError):
        recorded = {}
        found.append(EVAL_FILE)  # unreadable: still something a run would write over
    found += [f"{EVAL_FILE}: {p}" for p in protocols if p in recorded and p not in found]
    return found


def read_eval(out_dir: Path) -> dict[str, Any]:
    """``OUT/eval.json`` (empty skeleton when absent)."""
    path = Path(out_dir) / EVAL_FILE
    if not path.is_file():
        return {"label": None, "results": {}, "headline": {}}
    return json.loads(path.read_text(encoding="utf-8"))


def _write_eval(out_dir: Path, record: dict[str, Any]) -> None:
    record["headline"] = {
        name: (record["results"].get(protocol) or {}).get("metrics", {}).get(metric)
        for name, (protocol, metric) in HEADLINE.items()
    }
    general = record["results"].get("general")
    if general:
        record["headline"]["general"] = general.get("scores")
    atomic_write_text(Path(out_dir) / EVAL_FILE, json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def _captions_for(sets: dict[str | None, CaptionSet], protocol: str) -> CaptionSet:
    benchmark = PROTOCOLS[protocol].benchmark
    own, unnamed = sets.get(benchmark), sets.get(None)
    if own is None and unnamed is None:
        named = ", ".join(sorted(str(k) for k in sets)) or "none"
        raise InputError(
            f"{protocol} needs {benchmark} captions, and the caption files hold none (they hold: {named}); "
            f"caption the benchmark with `balcaprl caption --benchmark {benchmark} ...`, pass "
            f"--captions {benchmark}=FILE, or leave {protocol} out of --suite"
        )
    if own is None:
        return unnamed  # type: ignore[return-value]
    if unnamed is not None:  # own captions first, unnamed ones fill in
        merged = CaptionSet(benchmark, {**unnamed.captions, **own.captions}, own.sources + unnamed.sources)
        merged.model = own.model
        return merged
    return own


def comparability(result: ProtocolResult) -> list[str]:
    """Why ``result`` is not comparable with the paper's Table 1 (empty when it is): its prompts, its
    options against the official protocol's (each protocol's ``OFFICIAL_OPTIONS``), its judge."""
    official = PROTOCOLS[result.protocol].official_options
    return paper_comparability(
        result.protocol, result.settings.get("prompts"), departures(result.settings, official), result.judge
    )


def run_suite(
    captions: Sequence[str | Path],
    suite: Sequence[str],
    out_dir: Path,
    config: EvaluationConfig,
    *,
    label: str | None = None,
    cache_path: Path | None = None,
    no_cache: bool = False,
    on_start: Callable[[str, int], None] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    http_client: Any = None,
) -> dict[str, ProtocolResult]:
    """Run ``suite`` (protocol names, in order) on the caption files; write ``out_dir``; return the
    results. Raises :class:`~balcaprl.errors.InputError` (bad input) or ``ConfigError`` (``JudgeConfigError``)
    before paying for any call when the set-up is wrong."""
    unknown = [p for p in suite if p not in PROTOCOLS]
    if unknown or not suite:
        raise InputError(f"unknown protocol(s) {unknown}; choose from {', '.join(PROTOCOLS)}")
    out_dir = Path(out_dir)
    sets = read_caption_sets(captions)  # an InputError names the file and line

    def judge_config(protocol: str):
        cfg = config.judge_for(protocol)  # validated when the evaluation config loaded
        if cfg is None:
            raise InputError(f"{protocol} needs a judge: pass --judge FILE or set `judge:` in --config")
        if no_cache:
            return cfg.model_copy(update={"cache_path": None})
        if cache_path is not None or cfg.cache_path is None:
            return cfg.model_copy(update={"cache_path": Path(cache_path or out_dir / "judge_cache.sqlite")})
        return cfg

    record = read_eval(out_dir)
    record["label"] = label or record.get("label") or out_dir.name
    # Check everything first: a bad path found after an hour of paid calls is an expensive mistake.
    prompts = {name: PROTOCOLS[name].official_prompts(config.official) for name in suite}
    plan = [(name, _captions_for(sets, name), judge_config(name), PROTOCOLS[name].load(getattr(config, name)))
            for name in suite]  # fmt: skip
    record.setdefault("results", {})
    record["captions"] = sorted({s for c in sets.values() for s in c.sources})
    record["model"] = next((c.model for c in sets.values() if c.model), record.get("model"))
    results: dict[str, ProtocolResult] = {}
    for name, chosen, cfg, data in plan:
        protocol, section = PROTOCOLS[name], getattr(config, name)
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        if on_start is not None:
            on_start(name, len(data))
        judge = protocol.client(cfg, image_root=getattr(section, "images", None), http_client=http_client)
        result = protocol.run(
            judge, data, chosen, out_dir / name, section, prompts=prompts[name], label=record["label"],
            on_progress=None if on_progress is None else lambda d, t, p=name: on_progress(p, d, t),
        )  # fmt: skip
        result.refused = [row.as_dict() for row in getattr(data, "refused", [])]
        results[name] = result
        entry = result.as_dict()
        reasons = comparability(result)
        entry["comparable_with_paper"] = not reasons
        entry["not_comparable"] = reasons
        entry["rules"] = scoring_rules(name, result.settings, protocol.official_options)
        entry["captions"] = chosen.sources
        entry["finished"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        record["results"][name] = entry
        _write_eval(out_dir, record)
    return results
