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

Prints both, their ratio, and whether the target holds: ``score`` peak RSS under 1 GB. Run:
``.venv/bin/python benchmarks/bench_score_memory.py`` (about a minute). Not a timed test.
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
