"""`balcaprl judge serve --oracle DATASET`: the synthetic oracle judge behind the real client.

Skipped when the synthetic world is not installed in this checkout.
"""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from judge_testkit import config, judge_and_close, png_bytes

from balcaprl.judge import JudgeFailure, Judgement, JudgeRequest, OpenAICompatibleJudge
from balcaprl.rewards import score_verdict

pytest.importorskip("balcaprl.synthetic.oracle")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from balcaprl.synthetic.build import build_dataset

    return build_dataset(tmp_path_factory.mktemp("synthetic"), n_train=3, n_eval=1, seed=0)


@pytest.fixture(scope="module")
def oracle_url(dataset):
    process = subprocess.Popen(
        [sys.executable, "-m", "balcaprl.cli", "judge", "serve", "--port", "0", "--oracle", str(dataset)],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line.startswith("balcaprl judge server: http://127.0.0.1:"), line
    yield line.split()[-1]
    process.terminate()
    process.wait(timeout=10)
    process.stdout.close()


@pytest.mark.parametrize("mode", ["joint", "cached-reference"])
def test_oracle_judges_dataset_images_over_http(dataset, oracle_url, mode):
    rows = pq.read_table(dataset / "train.parquet").to_pylist()
    requests = [
        JudgeRequest(image=row["image"], caption=row["reference"], reference=row["reference"]) for row in rows
    ]
    requests.append(JudgeRequest(image=png_bytes(), caption="a red square", reference=rows[0]["reference"]))
    judge = OpenAICompatibleJudge(config(oracle_url, reference_mode=mode), image_root=dataset)
    outcomes = judge_and_close(judge, requests)
    for outcome in outcomes[:-1]:
        # the reference judged against itself: everything covered, and its claims are true
        assert isinstance(outcome, Judgement), outcome
        assert score_verdict(outcome.verdict).recall == 1.0 and score_verdict(outcome.verdict).precision > 0.5
    unknown = outcomes[-1]
    assert isinstance(unknown, JudgeFailure) and unknown.reason == "bad_input"
