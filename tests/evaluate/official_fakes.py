"""Tiny fake checkouts of the benchmarks' official code, for the tests of the official-prompt loading:
the official file names and variable names, with our own placeholder texts (never the real ones).

The DeCapBench and CapArena files end their module level with ``raise SystemExit``: balcaprl reads them
with ``ast`` and must never run them. The lmms-eval task file is loaded and run (as the real one is),
so it holds working placeholder functions whose behaviour differs from ours on purpose (a different
prompt layout, letters read as ``(B)``), to show that theirs are the ones used.

Each fake also builds its requests the way the official code builds them (the same message shapes,
fields and values: DeCapBench through the openai client's ``chat.completions.create``, CapArena and
lmms-eval through ``requests.post(json=...)``), so a test can run that code (:func:`run_fake`) and
compare what it would send with what balcaprl sends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

FAKE_SYSTEM = "PLACEHOLDER system message"

FAKE_DECAPBENCH = '''import base64  # balcaprl never runs this file (the request tests do)
import io
import json

from PIL import Image


def text_message_creator(prompt, sys_prompt="PLACEHOLDER system message"):
    return [{"role": "system", "content": sys_prompt}, {"role": "user", "content": prompt}]


def run_gpt_text(client, prompt, temperature=1.0, sys_prompt="PLACEHOLDER system message", n=1):
    msgs = text_message_creator(prompt, sys_prompt=sys_prompt)
    return client.chat.completions.create(
        model="gpt-4o-2024-05-13", messages=msgs, max_tokens=2000, temperature=temperature, n=n
    )


def pil2base64(pil_img):
    buf = io.BytesIO()
    pil_img.save(buf, format="jpeg")
    return base64.b64encode(buf.getvalue()).decode("utf-8")


def multimodal_message_creator(prompt, image_path, sys_prompt="PLACEHOLDER system message", detail="high"):
    image = Image.open(image_path).convert("RGB")
    part = {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{pil2base64(image)}", "detail": detail}}
    user = {"role": "user", "content": [part, {"type": "text", "text": prompt}]}
    return [{"role": "system", "content": sys_prompt}, user]


def run_gpt_multimodal(client, prompt, image_path, temperature=1.0, sys_prompt="PLACEHOLDER system message",
                       n=1, detail="high"):
    msgs = multimodal_message_creator(prompt, image_path, sys_prompt=sys_prompt, detail=detail)
    return client.chat.completions.create(
        model="gpt-4o-2024-05-13", messages=msgs, max_tokens=2000, temperature=temperature, n=n
    )


def format_json_input(input_list):
    res = "```json[\\n"
    for d in input_list:
        res += "  {},\\n".format(json.dumps(d, ensure_ascii=False))
    res += "]\\n```"
    return res


extract_prompt = """PLACEHOLDER-EXTRACT: list the facts as {{"fact": ..., "relevance": 1}}.
%% PLACEHOLDER caption:
{caption}
%% PLACEHOLDER list:
"""

verify_prompt = """PLACEHOLDER-VERIFY: mark each fact's verification 1 or 0.
%% PLACEHOLDER reference:
{reference_caption}
%% PLACEHOLDER facts:
{atomic_facts}
"""

match_prompt = """PLACEHOLDER-MATCH: give each fact its matched_oracle_id or None.
%% PLACEHOLDER ours:
{predicted_atomic_facts}
%% PLACEHOLDER theirs:
{oracle_atomic_facts}
%% PLACEHOLDER result:
"""

raise SystemExit("this placeholder module must never be run")
'''

FAKE_CAPARENA = '''import base64  # balcaprl never runs this file (the request tests do)
import json
import os

import requests

system_prompt_without_ref = """PLACEHOLDER-ARENA without a reference"""

system_prompt_with_ref = """PLACEHOLDER-ARENA: answer with two lines, Reason: ... and Judgment: ..."""


def call_llm(model_name, payload):
    response = requests.post("https://judge.invalid/v1/chat/completions", json={**payload, "temperature": 0.1})
    return response.json()["choices"][0]["message"]["content"]


def mllm_judge_pairs(caption_eval_cand_dir, imgs_dir, with_ref=True, cal_agree=True, eval_model_name=None):
    for item in json.load(open(caption_eval_cand_dir)):
        with open(os.path.join(imgs_dir, item["img"]), "rb") as f:
            image = base64.b64encode(f.read()).decode("utf-8")
        caption_1 = item["caption1"]
        caption_2 = item["caption2"]
        caption_ref = item["ref"]
        if with_ref:
            compare_prompt = f"PLACEHOLDER first:\\n{caption_1}\\nsecond:\\n{caption_2}\\nreference:\\n{caption_ref}\\nPLACEHOLDER {{braces}} stay."
        else:
            compare_prompt = f"PLACEHOLDER first:\\n{caption_1}\\nsecond:\\n{caption_2}"
        system = system_prompt_with_ref if with_ref else system_prompt_without_ref
        messages = [{"role": "system", "content": [{"type": "text", "text": system}]}]
        image_part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}", "detail": "high"}}
        messages.append({"role": "user", "content": [image_part, {"type": "text", "text": compare_prompt}]})
        payload = {"model": "gpt-4o-2024-08-06", "messages": messages, "max_tokens": 1500, "top_p": 0.9,
                   "temperature": 0.5}
        item["judge"] = call_llm("gpt-4o-2024-08-06", payload)


raise SystemExit("this placeholder module must never be run")
'''

FAKE_LMMS_UTILS = """import re

LETTER_ALPH = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CANNOT_ANSWER_TEXT = "PLACEHOLDER none of these"
QA_SYSTEM_PROMPT = "PLACEHOLDER-QA system message"


def add_cannot_answer_option(question_text, choices):
    lowered = [str(c).lower() for c in choices]
    if any("yes" in c for c in lowered) and any("no" in c for c in lowered):
        return choices
    return choices + [CANNOT_ANSWER_TEXT]


def build_caption_qa_prompt(caption, question, choices):
    lines = "\\n".join(f"({LETTER_ALPH[i]}) {c}" for i, c in enumerate(choices))
    return f"PLACEHOLDER-QA caption:\\n{caption}\\nPLACEHOLDER question: {question}\\n{lines}\\nPLACEHOLDER answer:"


def extract_letter(answer_text, num_options):
    match = re.search(r"\\(([A-Z])\\)", answer_text or "")
    if match and LETTER_ALPH.index(match.group(1)) < num_options:
        return match.group(1)
    return None


JUDGE_MODEL = "PLACEHOLDER/judge"


def call_llm_judge(prompt):
    import requests  # here, so that loading the task needs no requests (the real file imports it at the top)

    messages = [{"role": "system", "content": QA_SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    resp = requests.post("http://judge.invalid/v1/chat/completions",
                         json={"model": JUDGE_MODEL, "messages": messages, "temperature": 0.0, "max_tokens": 4})
    return resp.json()["choices"][0]["message"]["content"]
"""


def _git(root: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.org", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")  # fmt: skip
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


def git_commit_all(root: Path) -> str | None:
    """Make ``root`` a git work tree with one commit of everything; its commit (None without git)."""
    if shutil.which("git") is None:
        return None
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "placeholder checkout")
    return _git(root, "rev-parse", "HEAD").strip()


def fake_decapbench(root: Path, text: str = FAKE_DECAPBENCH) -> Path:
    (root / "eval").mkdir(parents=True, exist_ok=True)
    (root / "eval" / "evaluation_decapbench.py").write_text(text)
    return root


def fake_caparena(root: Path, text: str = FAKE_CAPARENA) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "vlm_as_a_judge.py").write_text(text)
    return root


def fake_lmms_eval(root: Path, text: str = FAKE_LMMS_UTILS) -> Path:
    folder = root / "lmms_eval" / "tasks" / "captionqa"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "utils.py").write_text(text)
    return root


# A stand-in for CaptionQA's captioning script: the same code shape, our own placeholder words.
FAKE_CQA_CAPTION = """
def caption_all(image_paths, prompt_text):
    current_prompt = prompt_text
    if len(image_paths) > 1:
        current_prompt = f"PLACEHOLDER {len(image_paths)} views follow. {prompt_text}"
    return current_prompt
"""


def fake_captionqa_repo(root: Path, text: str = FAKE_CQA_CAPTION) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "caption.py").write_text(text)
    return root


# ----------------------------------------------------------------------------------------- running the fakes


class OfficialRecorder:
    """Stands in for what the official code sends through: the openai client (``chat.completions.
    create(**kwargs)``: the kwargs are the request's JSON body) and ``requests`` (``post(url,
    json=body)``). Records each body and answers with ``answer``."""

    def __init__(self, answer: str = "A"):
        self.bodies: list[dict] = []
        self.answer = answer
        self.chat = self.completions = self  # client.chat.completions.create

    def _reply(self):
        message = SimpleNamespace(content=self.answer)
        data = {"choices": [{"message": {"content": self.answer}}]}
        return SimpleNamespace(choices=[SimpleNamespace(message=message)], json=lambda: data)

    def create(self, **kwargs):
        self.bodies.append(kwargs)
        return self._reply()

    def post(self, url, json=None, **kwargs):
        self.bodies.append(json)
        return self._reply()


def run_fake(text: str) -> dict:
    """Run a fake official file (not its final ``raise SystemExit``); its module namespace. Put an
    :class:`OfficialRecorder` in ``sys.modules["requests"]`` first (monkeypatch) for the files that
    import ``requests``."""
    source = text.replace('raise SystemExit("this placeholder module must never be run")', "")
    namespace: dict = {"__name__": "official_fake"}
    exec(compile(source, "official_fake.py", "exec"), namespace)
    return namespace
