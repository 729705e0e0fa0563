"""The page's HTML without a browser: untrusted text can only enter as escaped JSON, and the
Content-Security-Policy names exactly the page's own script and style."""

from __future__ import annotations

import base64
import hashlib
import json
import re

from hypothesis import given
from hypothesis import strategies as st
from inspect_testkit import HOSTILE

from balcaprl.inspect import load_inspection, page_data, render_page
from balcaprl.inspect.page import script_json

DATA_BLOCK = re.compile(r'<script type="application/json" id="balcaprl-data">(.*?)</script>', re.S)


@given(st.recursive(st.text() | st.integers() | st.booleans() | st.none(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4)))  # fmt: skip
def test_script_json_round_trips_and_cannot_close_a_tag(value):
    text = script_json(value)
    assert json.loads(text) == value
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}


def test_hostile_captions_stay_inside_the_data_block(scored, tmp_path):
    found = load_inspection(scored["folder"])
    data = page_data(found, tmp_path / "page.html", "embed")
    page = render_page(data)
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the data block and the script
    (block,) = DATA_BLOCK.findall(page)
    assert json.loads(block) == data
    for text in HOSTILE:
        assert text not in page
    assert "alert(1)" in block and "<script>alert" not in page and "<img src=x" not in page
    assert [c["caption"] for c in json.loads(block)["cards"] if "alert" in c["caption"]] == list(HOSTILE)


def test_the_policy_allows_only_the_pages_own_script_and_style(scored, tmp_path):
    page = render_page(page_data(load_inspection(scored["folder"]), tmp_path / "page.html", "none"))
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    style = re.search(r"<style>(.*?)</style>", page, re.S).group(1)

    def digest(text: str) -> str:
        return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    directives = dict(part.strip().split(" ", 1) for part in policy.replace("&#x27;", "'").split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == f"'sha256-{digest(script)}'"
    assert directives["style-src"] == f"'sha256-{digest(style)}'"
    assert "http" not in policy  # no network source anywhere
