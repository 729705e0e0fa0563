"""`balcaprl inspect` on 10,000 captions: writing the page, and opening it in headless Chromium.

Builds a synthetic dataset of 250 images and 40 captions per image (good ones and every flaw kind),
judged by the oracle, written as a `balcaprl score` folder (scores.jsonl, summary.json,
verdicts.jsonl). Then measures:

- page generation: reading the folder, thumbnails of the 250 images, the HTML (targets: < 10 s);
  the baseline in the same run is ``json.dumps`` of the page's data, the least any page writer does;
- opening the page: from navigation to the first cards on screen, as the page measures it
  (``performance.now()`` after its first render; target < 3 s), against a blank page in the same
  browser as the baseline; then applying a filter ("hallucinated only") and a sort on 10,000 cards.

Run: ``.venv/bin/python benchmarks/bench_inspect.py`` (about a minute; needs Chromium for the second
part, ``apt-get install chromium``). Not a timed test.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from balcaprl.inspect import load_inspection, page_data, write_page
from balcaprl.inspect.cards import metric_scores
from balcaprl.synthetic.build import build_dataset
from balcaprl.synthetic.oracle import OracleJudge
from balcaprl.testing.caption_fixture import CAPTION_KINDS, synthetic_captions

N_IMAGES, PER_IMAGE = 250, 40  # 10,000 captions


def scores_folder(root: Path) -> Path:
    """A `balcaprl score` folder of 10,000 oracle-judged captions (the files that command writes)."""
    dataset = build_dataset(root / "data", n_train=N_IMAGES, n_eval=1, seed=0)
    kinds = [CAPTION_KINDS[i % len(CAPTION_KINDS)] for i in range(PER_IMAGE)]
    rows = synthetic_captions(dataset, kinds)
    oracle = OracleJudge.from_dataset(dataset)
    folder = root / "scores"
    folder.mkdir()
    scores, verdicts = [], []
    for row in rows:
        verdict = oracle.verdict(
            oracle.lookup(dataset / row["image"]), row["caption"], row["reference"], "evaluation"
        )
        metric = metric_scores(verdict)
        scores.append({"image": row["image"], **{k: metric[k] for k in ("precision", "recall", "linguistic", "b_capscore")},
                       "failure": None, "truncated_input": False})  # fmt: skip
        verdicts.append({"image": row["image"], "caption": row["caption"], "reference": row["reference"],
                         "verdict": verdict.model_dump(mode="json")})  # fmt: skip
    (folder / "scores.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scores))
    (folder / "verdicts.jsonl").write_text("".join(json.dumps(v) + "\n" for v in verdicts))
    (folder / "summary.json").write_text(json.dumps({"image_root": str(dataset.resolve())}))
    return folder


def main() -> None:
    print(
        f"load average of this machine: {', '.join(f'{x:.1f}' for x in os.getloadavg())} ({os.cpu_count()} cores)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        folder = scores_folder(root)
        print(
            f"fixture: {N_IMAGES * PER_IMAGE:,} oracle-judged captions in {time.perf_counter() - start:.1f} s"
        )

        page = root / "report.html"
        start, cpu = time.perf_counter(), time.process_time()
        found = load_inspection(folder)
        read_s = time.perf_counter() - start
        write_page(found, page)
        generate_s, generate_cpu = time.perf_counter() - start, time.process_time() - cpu
        data = page_data(found, page, "none")
        start = time.perf_counter()
        json.dumps(data, ensure_ascii=False)
        baseline_s = time.perf_counter() - start
        print(f"page generation, {len(found.cards):,} captions, {len(found.images)} embedded thumbnails: "
              f"{generate_s:.2f} s (reading {read_s:.2f} s; {generate_cpu:.2f} s of CPU), "
              f"{page.stat().st_size / 1e6:.1f} MB  [target < 10 s]")  # fmt: skip
        print(
            f"  baseline json.dumps of the data: {baseline_s:.2f} s -> generation is {generate_s / baseline_s:.1f}x it"
        )

        from balcaprl.testing.browser import Browser, find_chromium

        if find_chromium() is None:
            print("opening: skipped (no Chromium; apt-get install chromium)")
            return
        blank = root / "blank.html"
        blank.write_text("<!doctype html><title>blank</title><p>blank</p>")
        with Browser() as browser:
            blank_s, first_ms, open_s = [], [], []
            for _ in range(3):
                browser.open("about:blank")
                blank_s.append(browser.open(blank.as_uri()))
                browser.open("about:blank")
                open_s.append(
                    browser.open(
                        page.as_uri(), wait_for="document.body && document.body.dataset.ready === '1'"
                    )
                )
                first_ms.append(browser.evaluate("window.balcaprlInspect.firstRenderMs"))
            cards = browser.evaluate("document.querySelectorAll('.card').length")
            filter_ms = browser.evaluate(
                "(() => { const t = performance.now(); const c = document.getElementById('ctl-halluc');"
                " c.checked = true; c.dispatchEvent(new Event('change')); return performance.now() - t; })()"
            )
            matching = browser.evaluate("Number(document.getElementById('count').dataset.matching)")
            sort_ms = browser.evaluate(
                "(() => { const t = performance.now(); const c = document.getElementById('ctl-sort');"
                " c.value = 'b_capscore'; c.dispatchEvent(new Event('change')); return performance.now() - t; })()"
            )
            assert not browser.errors, browser.errors
        first, total, base = (
            statistics.median(first_ms) / 1000,
            statistics.median(open_s),
            statistics.median(blank_s),
        )
        print(f"opening in headless Chromium: first {cards} cards on screen {first:.2f} s after navigation "
              f"(until load + ready: {total:.2f} s)  [target < 3 s]")  # fmt: skip
        print(f"  baseline blank page: {base:.3f} s -> the page takes {total / base:.0f}x a blank page")
        print(f"filter 'hallucinated only' on {len(found.cards):,} cards: {filter_ms:.0f} ms ({matching:,} match); "
              f"sort by b-CapScore: {sort_ms:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
