"""Oracle judge throughput: verdicts per second on one core, by caption kind and image form.

Builds 200 scenes in memory, then judges reference captions and each flawed kind, with the image as
encoded PNG bytes (the HTTP client's form: file-hash lookup), as a decoded PIL image (pixel-hash
lookup), and once as JPEG bytes (a near-exact match: thumbnail candidates, each rendered once to be
compared). The oracle's target is thousands of verdicts
a second, so that judging never bounds the demo's RL steps.

Run: ``.venv/bin/python benchmarks/bench_oracle.py`` (about 20 s). Not a timed test.
"""

from __future__ import annotations

import io
import random
import time

from balcaprl.judge import Judgement, JudgeRequest
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.flaws import FLAW_KINDS, flawed_caption
from balcaprl.synthetic.oracle import OracleJudge
from balcaprl.synthetic.render import png_bytes, render_scene
from balcaprl.synthetic.scenes import generate_scenes


def _rate(oracle: OracleJudge, requests: list[JudgeRequest]) -> float:
    start = time.perf_counter()
    outcomes = [oracle.judge(r) for r in requests]
    elapsed = time.perf_counter() - start
    assert all(isinstance(o, Judgement) for o in outcomes)
    return len(requests) / elapsed


def main() -> None:
    scenes = generate_scenes(200, seed=0)
    oracle = OracleJudge.from_scenes(scenes)
    rng = random.Random(0)
    images = [render_scene(s) for s in scenes]
    encoded = [png_bytes(i) for i in images]
    refs = [reference_caption(s, rng) for s in scenes]
    for image, ref in zip(encoded, refs, strict=True):  # warm the reference cache, as training does
        oracle.judge(JudgeRequest(image, ref, ref))
    kinds = {"reference": [reference_caption(s, rng) for s in scenes]}
    kinds |= {kind: [flawed_caption(s, kind, rng) for s in scenes] for kind in FLAW_KINDS}
    print(f"{'caption kind':<14} {'PNG bytes':>10} {'PIL image':>10}  (verdicts/s, one core)")
    total = []
    for kind, captions in kinds.items():
        as_bytes = [JudgeRequest(e, c, r) for e, c, r in zip(encoded, captions, refs, strict=True)] * 5
        as_pil = [JudgeRequest(i, c, r) for i, c, r in zip(images, captions, refs, strict=True)] * 5  # type: ignore[arg-type]
        b, p = _rate(oracle, as_bytes), _rate(oracle, as_pil)
        total.append(b)
        print(f"{kind:<14} {b:>10.0f} {p:>10.0f}")
    print(f"{'mean':<14} {sum(total) / len(total):>10.0f}")
    jpegs = []
    for image in images[:50]:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=85)
        jpegs.append(buffer.getvalue())
    fresh = OracleJudge.from_scenes(scenes)
    rate = _rate(fresh, [JudgeRequest(j, r, r) for j, r in zip(jpegs, refs, strict=False)])
    print(
        f"first sight of a JPEG copy (decode, thumbnail candidates over {len(fresh)} scenes, render): {rate:.0f}/s"
    )


if __name__ == "__main__":
    main()
