"""Peak memory of `balcaprl score` on large photos: 64 images of 48 MP at concurrency 128.

A 48 MP photo (8000 x 6000) costs 144 MB decoded at full size; 64 of them judged with 128 calls in
flight would need gigabytes if each were decoded whole and several at once. ``score`` opens images
through :func:`balcaprl.images.open_image` (a JPEG larger than the judge's ``max_image_side`` is
decoded at 1/2, 1/4 or 1/8 scale) and the judge's loader decodes at most ``DECODE_SLOTS`` at a time.

Measured, each in a process of its own: its peak resident set size (``VmHWM`` of
``/proc/self/status`` at exit, which counts only that process; the ``ru_maxrss`` a parent sees from
``wait4`` would include the parent's own size at the time of the fork):

* ``score`` on the 64 images (one generated JPEG, hard-linked 64 times, so every image is a separate
  file that is read, hashed and decoded) against a loopback judge server in this process (scripted
  judge, 0.5 s per answer), ``--no-cache``;
* the baseline: a process that imports what ``score`` imports and decodes *one* of the images at full
  size, the cost of a single naive decode.

Prints both, their ratio, and whether the target holds: ``score`` peak RSS under 1 GB.

``--scale`` measures instead how ``score`` grows with the number of captions (small images, a
loopback scripted judge, one shared verdict cache), each run a process of its own:

* peak RSS of ``score`` on the first ``--small`` captions and on all ``--large`` of them, with a
  cold cache and then a warm one; the target: the large run's peak within 10% of the small run's;
* per caption on the warm cache: the difference of the two warm runs' wall times over the
  difference of their caption counts (process start and imports cancel out), against a bare SQLite
  read of one cached answer (``SELECT value FROM judge_cache WHERE key = ?``) timed on the same
  cache in this process; the target: within 5x;
* what every warm caption must still do whatever the code around it, each timed alone in this
  process on the large run's files: hash its image (the cache key names an image by its bytes),
  check the cached answer as a fresh one would be checked, and its share of the summary's bootstrap.

Run: ``.venv/bin/python benchmarks/bench_score_memory.py`` (about a minute), ``... --scale`` (a few
minutes at the defaults 2,000 and 20,000; ``nice -n 10`` on a shared machine). Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.scripted_judge import ScriptedJudge

TARGET_BYTES = 1 << 30  # 1 GB
REFERENCE = "A wide landscape with a lake. Mountains behind the lake. A small boat on the water."

# Every measured process writes its peak RSS (kB) to the file named by BENCH_PEAK_FILE at exit.
_PEAK_AT_EXIT = (
    "import atexit, os; atexit.register(lambda: open(os.environ['BENCH_PEAK_FILE'], 'w').write("
    "open('/proc/self/status').read().split('VmHWM:')[1].split()[0])); "
)
# The baseline: the imports of `score`, then one image decoded at full size.
_ONE_FULL_DECODE = _PEAK_AT_EXIT + (
    "import sys; import balcaprl.cli.evaluate, balcaprl.judge.client, balcaprl.evaluate.score; "
    "from PIL import Image; Image.MAX_IMAGE_PIXELS = None; image = Image.open(sys.argv[1]); image.load(); "
    "print(image.size)"
)
# `balcaprl score ...`, as the console script runs it.
_SCORE = (
    _PEAK_AT_EXIT
    + "import sys, runpy; sys.argv[0] = 'balcaprl'; runpy.run_module('balcaprl.cli', run_name='__main__')"
)
# The photo is made in a process of its own, so this one stays small.
_MAKE_PHOTO = "import sys; from bench_score_memory import _photo; _photo(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))"


def _photo(path: Path | str, width: int, height: int) -> None:
    """A JPEG with photo-like content: smooth shapes plus sensor-like noise (so it does not compress
    to nothing), at quality 90: ~ the bytes of a real 48 MP photo."""
    from PIL import Image, ImageFilter

    base = Image.linear_gradient("L").resize((width, height))
    noise = Image.effect_noise((width, height), 24)
    red = Image.blend(base, noise, 0.35)
    green = Image.blend(base.transpose(Image.Transpose.ROTATE_180), noise, 0.25).filter(
        ImageFilter.BoxBlur(1)
    )
    blue = Image.blend(base.transpose(Image.Transpose.FLIP_LEFT_RIGHT), noise, 0.3)
    Image.merge("RGB", (red, green, blue)).save(path, "JPEG", quality=90)


def _run(argv: list[str], env: dict[str, str], peak_file: Path) -> tuple[int, int, float, str]:
    """(exit status, peak RSS in bytes, wall seconds, output) of one child process."""
    start = time.perf_counter()
    peak_file.unlink(missing_ok=True)
    result = subprocess.run(
        argv, env={**env, "BENCH_PEAK_FILE": str(peak_file)}, capture_output=True, text=True
    )
    peak = int(peak_file.read_text()) * 1024 if peak_file.exists() else -1
    return result.returncode, peak, time.perf_counter() - start, result.stdout + result.stderr


def _read_s(cache: Path, repeats: int = 3) -> tuple[float, float]:
    """Seconds per read of one cached answer: a bare ``SELECT value ... WHERE key = ?``, and the judge
    cache's own ``get`` (the same select, then the JSON decoded); best of ``repeats`` passes over every
    key, in a shuffled order."""
    import random
    import sqlite3

    from balcaprl.judge.cache import JudgeCache

    db = sqlite3.connect(cache)
    keys = [key for (key,) in db.execute("SELECT key FROM judge_cache")]
    random.Random(0).shuffle(keys)
    bare = judged = float("inf")
    judge_cache = JudgeCache(cache)
    for _ in range(repeats):
        start = time.perf_counter()
        for key in keys:
            db.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
        bare = min(bare, (time.perf_counter() - start) / len(keys))
        start = time.perf_counter()
        for key in keys:
            judge_cache.get(key)
        judged = min(judged, (time.perf_counter() - start) / len(keys))
    db.close()
    judge_cache.close()
    return bare, judged


def _floor_s(root: Path, images: Path, n: int) -> dict[str, float]:
    """Seconds per caption of what a warm-cache caption cannot skip while keeping its guarantees, each
    timed alone (best of 3) on the large run's own files: hashing its image (the cache key names the
    image by its bytes, never by its path), reading its answer (as ``score`` does: a span's keys in one
    query) and checking it again as a fresh one would be (a hand-edited cache row must not pass), and
    its share of the summary's bootstrap (1,000 resamples of every mean)."""
    import sqlite3

    from balcaprl.evaluate.summary import summarise_scores
    from balcaprl.judge.cache import JudgeCache
    from balcaprl.judge.calls import cached_answer
    from balcaprl.judge.images import ImageLoader
    from balcaprl.judge.schemas import to_verdict, verdict_schema

    db = sqlite3.connect(root / "cache.sqlite")
    keys = [key for (key,) in db.execute("SELECT key FROM judge_cache")]
    db.close()
    cache = JudgeCache(root / "cache.sqlite")
    schema = verdict_schema("evaluation")
    with (root / f"out-warm-{n}" / "scores.jsonl").open() as handle:
        rows = [json.loads(line) for line in handle]
    names = [f"{i}.jpg" for i in range(n)]

    def best(work, count: int) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            work()
            times.append((time.perf_counter() - start) / count)
        return min(times)

    def hash_all() -> None:
        loader = ImageLoader(1024, root=images)  # a fresh loader: nothing remembered
        for name in names:
            loader.sha256(name)

    def read_and_check_all() -> None:
        for start in range(0, len(keys), 256):  # score's spans: twice its concurrency of 128
            stored = cache.get_many(keys[start : start + 256])
            for value in stored.values():
                to_verdict(cached_answer(value, schema), value["json"])

    floor = {
        "hash its image file (open, read, sha256)": best(hash_all, n),
        "read its answer in a span's query, check it (schema, verdict)": best(read_and_check_all, len(keys)),
        "its share of the bootstrap (1,000 resamples, 4 means)": best(
            lambda: summarise_scores(rows), len(rows)
        ),
    }
    cache.close()
    return floor


def scale(args: argparse.Namespace, env: dict[str, str]) -> None:
    """Peak RSS at ``--small`` and ``--large`` captions, and the warm-cache time per caption."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-score-scale-") as tmp,
        JudgeServer(ScriptedJudge()) as server,
    ):
        from PIL import Image

        root = Path(tmp)
        images = root / "images"
        images.mkdir()
        Image.new("RGB", (64, 48), (40, 120, 200)).save(images / "0.jpg", quality=90)
        for i in range(1, args.large):
            os.link(images / "0.jpg", images / f"{i}.jpg")  # a file per caption, one on disk
        lines = [
            json.dumps({"image": f"{i}.jpg", "caption": f"A lake with {i} small boats and a wooden pier."})
            + "\n"
            for i in range(args.large)
        ]
        for n in (args.small, args.large):
            (root / f"captions-{n}.jsonl").write_text("".join(lines[:n]))
        (root / "references.json").write_text(json.dumps({f"{i}.jpg": REFERENCE for i in range(args.large)}))
        judge = {"base_url": server.base_url, "model": "scripted", "api_key_env": None,
                 "cache_path": str(root / "cache.sqlite"), "concurrency": args.concurrency, "max_retries": 0,
                 "timeout_s": 120}  # fmt: skip
        (root / "judge.yaml").write_text(yaml.safe_dump(judge))
        peak_file = root / "peak-rss-kb"
        figures: dict[tuple[str, int], tuple[int, float]] = {}
        for cache in ("cold", "warm"):  # the cold large run finds the small run's answers cached
            for n in (args.small, args.large):
                out = root / f"out-{cache}-{n}"
                argv = [sys.executable, "-c", _SCORE, "score", "--images", str(images), "--captions",
                        str(root / f"captions-{n}.jsonl"), "--references", str(root / "references.json"),
                        "--judge", str(root / "judge.yaml"), "--out", str(out), "--no-progress"]  # fmt: skip
                code, peak, wall, output = _run(argv, env, peak_file)
                if code != 0:
                    raise SystemExit(f"score ({cache}, {n}) failed (exit {code}):\n{output}")
                assert json.loads((out / "summary.json").read_text())["n_scored"] == n
                figures[cache, n] = (peak, wall)
                print(
                    f"score, {cache} cache, {n:6d} captions: peak RSS {peak / 2**20:6.0f} MiB, {wall:6.1f} s"
                )
        calls = server.counters.total
        server.stop()  # the reads below are timed in this process: its server thread is gone
        bare, get = _read_s(root / "cache.sqlite")
        floor = _floor_s(root, images, args.large)

    print(f"judge calls: {calls} (one per caption of the large set)")
    for cache in ("cold", "warm"):
        ratio = figures[cache, args.large][0] / figures[cache, args.small][0]
        verdict = "PASS" if ratio <= 1.10 else "FAIL"
        print(
            f"{verdict}: {cache} cache, peak RSS at {args.large} / at {args.small} captions: {ratio:.3f} (target <= 1.10)"
        )
    per_caption = (figures["warm", args.large][1] - figures["warm", args.small][1]) / (
        args.large - args.small
    )
    ratio = per_caption / bare
    print(f"warm cache: {per_caption * 1e3:.3f} ms per caption; bare SQLite read: {bare * 1e3:.4f} ms; "
          f"JudgeCache.get: {get * 1e3:.4f} ms")  # fmt: skip
    print(
        f"{'PASS' if ratio <= 5 else 'FAIL'}: warm-cache time per caption / bare SQLite read: {ratio:.1f} (target <= 5)"
    )
    print(
        "what every warm caption must still do, each timed alone in this process (per caption, / bare read):"
    )
    for name, seconds in floor.items():
        print(f"  {name:62s} {seconds * 1e3:.4f} ms  {seconds / bare:4.1f}x")
    total = sum(floor.values())
    print(f"  {'together':62s} {total * 1e3:.4f} ms  {total / bare:4.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", action="store_true", help="Measure growth with the number of captions.")
    parser.add_argument("--small", type=int, default=2000, help="--scale: captions of the small run.")
    parser.add_argument("--large", type=int, default=20000, help="--scale: captions of the large run.")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--width", type=int, default=8000)
    parser.add_argument("--height", type=int, default=6000)
    parser.add_argument("--latency", type=float, default=0.5, help="Scripted judge: seconds per answer.")
    args = parser.parse_args()

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), *sys.path]),
    }
    if args.scale:
        scale(args, env)
        return
    with (
        tempfile.TemporaryDirectory(prefix="bench-score-memory-") as tmp,
        JudgeServer(ScriptedJudge(latency_s=args.latency)) as server,
    ):
        root = Path(tmp)
        images = root / "images"
        images.mkdir()
        first = images / "photo-000.jpg"
        subprocess.run(
            [sys.executable, "-c", _MAKE_PHOTO, str(first), str(args.width), str(args.height)],
            env={**env, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), env["PYTHONPATH"]])},
            check=True,
        )
        names = [f"photo-{i:03d}.jpg" for i in range(args.images)]
        for name in names[1:]:
            os.link(first, images / name)  # separate files (each read, hashed, decoded), one on disk
        (root / "captions.jsonl").write_text(
            "".join(
                json.dumps({"image": n, "caption": f"A lake with {i} small boats."}) + "\n"
                for i, n in enumerate(names)
            )
        )
        (root / "references.json").write_text(json.dumps({n: REFERENCE for n in names}))
        judge = {"base_url": server.base_url, "model": "scripted", "api_key_env": None, "cache_path": None,
                 "concurrency": args.concurrency, "max_retries": 0, "timeout_s": 120, "max_image_side": 1024}  # fmt: skip
        (root / "judge.yaml").write_text(yaml.safe_dump(judge))
        megapixels = args.width * args.height / 1e6
        print(f"{args.images} JPEGs of {megapixels:.0f} MP ({first.stat().st_size / 1e6:.1f} MB each), "
              f"concurrency {args.concurrency}, judge latency {args.latency} s")  # fmt: skip

        peak_file = root / "peak-rss-kb"
        code, baseline, _, output = _run([sys.executable, "-c", _ONE_FULL_DECODE, str(first)], env, peak_file)
        if code != 0:
            raise SystemExit(f"the baseline failed:\n{output}")
        score = [sys.executable, "-c", _SCORE, "score", "--images", str(images), "--captions",
                 str(root / "captions.jsonl"), "--references", str(root / "references.json"), "--judge",
                 str(root / "judge.yaml"), "--out", str(root / "out"), "--no-cache", "--no-progress"]  # fmt: skip
        code, peak, wall, output = _run(score, env, peak_file)
        if code != 0:
            raise SystemExit(f"score failed (exit {code}):\n{output}")
        summary = json.loads((root / "out" / "summary.json").read_text())
        calls = server.counters.total

    print(f"one image decoded at full size (+ score's imports): peak RSS {baseline / 2**20:7.0f} MiB")
    print(f"score, {summary['n_scored']}/{summary['n_captions']} scored in {wall:.1f} s, {calls} calls: "
          f"peak RSS {peak / 2**20:7.0f} MiB")  # fmt: skip
    print(f"ratio score / one full decode: {peak / baseline:.2f}")
    verdict = "PASS" if peak < TARGET_BYTES else "FAIL"
    print(f"{verdict}: score's peak RSS {peak / 2**30:.2f} GiB {'<' if peak < TARGET_BYTES else '>='} 1 GiB")


if __name__ == "__main__":
    main()
