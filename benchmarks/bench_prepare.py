"""`prepare sharegpt4v` on a 1,000-entry fixture in ShareGPT4V's layout: images checked per second.

The fixture: 1,000 good entries with 640x480 JPEGs (the size of most COCO images in ShareGPT4V) spread
over the seven source folders, plus one entry for every kind of bad input. Prints the time of each
step, images per second for the full check (read, sha256, complete decode) with a process per core
and with one process, and the rate of a resumed run, which must check nothing again. The goal from
the issue: well under a minute on 2 cores. Measured figures, not a timed assertion.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from balcaprl.data.fixture import make_sharegpt4v_fixture
from balcaprl.data.sharegpt4v import PrepareOptions, default_workers, prepare_sharegpt4v


def run(fixture, out: Path, workers: int):
    start = time.perf_counter()
    report = prepare_sharegpt4v(
        fixture.json_path, fixture.image_root, out, options=PrepareOptions(eval_size=100, workers=workers)
    )
    return report, time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        fixture = make_sharegpt4v_fixture(Path(tmp) / "sharegpt4v", n_good=1000, size=(640, 480))
        size_mb = sum(f.stat().st_size for f in fixture.image_root.rglob("*") if f.is_file()) / 1e6
        print(
            f"fixture: {len(fixture.good) + len(fixture.bad)} entries, {size_mb:.0f} MB of images "
            f"(generated in {time.perf_counter() - start:.1f} s)"
        )

        cores = default_workers()
        for workers in sorted({cores, 1}, reverse=True):
            report, total = run(fixture, Path(tmp) / f"out-{workers}", workers)
            steps = ", ".join(f"{k} {v:.2f} s" for k, v in report.seconds.items())
            print(
                f"workers={workers}: {report.kept} kept / {sum(report.rejections.values())} rejected in "
                f"{total:.2f} s ({steps}); {report.images_per_second():.0f} images/s checked, "
                f"{report.entries / total:.0f} entries/s end to end"
            )

        report, total = run(fixture, Path(tmp) / f"out-{cores}", cores)
        print(
            f"resumed run: {report.images_checked} images checked again, {report.images_reused} reused, "
            f"{total:.2f} s"
        )
        print(f"cores available: {cores} (os.cpu_count() {os.cpu_count()})")


if __name__ == "__main__":
    main()
