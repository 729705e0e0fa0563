"""The page in a real browser: headless Chromium (Debian's package) over the DevTools protocol.

Opens generated pages from disk (file://), counts the caption cards, applies filters and a sort and
checks the cards that remain against the data, renders more cards on scrolling, loads linked images,
shows hostile captions as text, and ends with no console error, no CSP violation and no dialog. The
screenshot is kept as an artefact (its path is printed; BALCAPRL_TEST_ARTIFACTS=DIR copies it there).

Skipped where Chromium is missing, except where BALCAPRL_REQUIRE_BROWSER=1 (CI) makes that a failure.
"""

from __future__ import annotations

import copy
import os
import shutil

import pytest
from inspect_testkit import HOSTILE, need_browser

from balcaprl.inspect import load_inspection, write_page

READY = "document.body && document.body.dataset.ready === '1'"
CARDS = "document.querySelectorAll('.card').length"
MATCHING = "Number(document.getElementById('count').dataset.matching)"
FIRST_IMAGE_LOADED = "(() => { const i = document.querySelector('.card .thumb img'); return i.complete && i.naturalWidth > 0; })()"


@pytest.fixture(scope="module")
def browser():
    from balcaprl.testing.browser import Browser

    with Browser(need_browser()) as b:
        yield b


def set_control(browser, name: str, value) -> None:
    prop = "checked" if isinstance(value, bool) else "value"
    browser.evaluate(
        f"(() => {{ const c = document.getElementById('ctl-{name}'); c.{prop} = {str(value).lower() if isinstance(value, bool) else repr(value)};"
        " c.dispatchEvent(new Event('change')); })()"
    )


def test_filters_sort_and_hostile_text_in_a_real_browser(browser, scored, tmp_path_factory):
    found = load_inspection(scored["folder"])
    cards = found.cards
    page = write_page(found, tmp_path_factory.mktemp("page") / "report.html", "embed")
    browser.open(page.as_uri(), wait_for=READY)

    # every card is on the page (fewer than one chunk), with its image
    assert browser.evaluate(CARDS) == browser.evaluate(MATCHING) == len(cards)
    assert (
        browser.evaluate("document.querySelectorAll('.card .thumb img').length") == len(cards) - 1
    )  # the bad image
    assert browser.evaluate(
        "[...document.querySelectorAll('.card .thumb img')].every(i => i.src.startsWith('data:image/png'))"
    )
    browser.wait_for(FIRST_IMAGE_LOADED)  # the others load lazily, when scrolled to

    # hostile captions are shown as text, and nothing they contain ran or became an element
    shown = browser.evaluate("[...document.querySelectorAll('.card .caption')].map(p => p.textContent)")
    assert [t for t in shown if "alert" in t] == list(HOSTILE)
    assert browser.evaluate("document.querySelectorAll('img[src=x]').length") == 0
    assert browser.evaluate("document.querySelectorAll('script').length") == 2  # the data block, the script
    assert browser.dialogs == []

    # "hallucinated only": exactly the cards with a hallucinated assertion remain
    set_control(browser, "halluc", True)
    hallucinated = [i for i, c in enumerate(cards) if (c.get("halluc") or 0) > 0]
    assert 0 < len(hallucinated) < len(cards)
    assert browser.evaluate(CARDS) == browser.evaluate(MATCHING) == len(hallucinated)
    indices = browser.evaluate("[...document.querySelectorAll('.card')].map(c => Number(c.dataset.index))")
    assert sorted(indices) == hallucinated
    assert "halluc=1" in browser.evaluate("location.hash")  # the view is in the URL
    set_control(browser, "halluc", False)

    # meta-commentary only, then by failure reason
    set_control(browser, "meta", True)
    assert browser.evaluate(MATCHING) == sum((c.get("meta") or 0) > 0 for c in cards)
    set_control(browser, "meta", False)
    set_control(browser, "failure", "reason:bad_input")
    assert browser.evaluate(CARDS) == 1
    assert "judge failure: bad_input" in browser.evaluate(
        "document.querySelector('.card .failure-line').textContent"
    )
    set_control(browser, "failure", "all")

    # sort by precision, low first: the page's order is the data's (ties in file order, failures last)
    set_control(browser, "sort", "precision")
    set_control(browser, "order", "asc")
    indices = browser.evaluate("[...document.querySelectorAll('.card')].map(c => Number(c.dataset.index))")
    judged = sorted((c["precision"], i) for i, c in enumerate(cards) if c["precision"] is not None)
    assert indices == [i for _, i in judged] + [i for i, c in enumerate(cards) if c["precision"] is None]

    # a view given in the URL fragment is applied on opening, and when the fragment changes
    browser.open("about:blank")
    browser.open(page.as_uri() + "#failure=judged&halluc=1&sort=recall", wait_for=READY)
    assert browser.evaluate(MATCHING) == len(hallucinated)
    assert browser.evaluate("document.getElementById('ctl-sort').value") == "recall"
    browser.evaluate("location.hash = '#failure=reason:bad_input'")
    browser.wait_for(f"{MATCHING} === 1")
    browser.evaluate("location.hash = ''")
    browser.wait_for(f"{MATCHING} === {len(cards)}")

    shot = browser.screenshot(tmp_path_factory.getbasetemp() / "artifacts" / "inspect-browser.png")
    print(f"screenshot: {shot}")
    if os.environ.get("BALCAPRL_TEST_ARTIFACTS"):
        shutil.copy(shot, os.environ["BALCAPRL_TEST_ARTIFACTS"])
    assert shot.stat().st_size > 10_000
    assert browser.errors == [] and browser.dialogs == []


def test_cards_render_lazily_and_linked_images_load(browser, scored, tmp_path):
    found = load_inspection(scored["folder"])
    base = found.cards
    found.cards = []
    for copy_number in range(20):  # 20 x 27 cards
        for card in base:
            found.cards.append(dict(copy.deepcopy(card), id=f"{card['id']}#{copy_number}"))
    page = write_page(found, tmp_path / "big.html", "link")
    browser.open(page.as_uri(), wait_for=READY)
    total = len(found.cards)
    assert browser.evaluate(MATCHING) == total
    first = browser.evaluate(CARDS)
    assert 0 < first < total  # one chunk, not the whole list
    for _ in range(100):
        if browser.evaluate(CARDS) == total:
            break
        browser.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        browser.wait_for(f"{CARDS} > 0")
    assert browser.evaluate(CARDS) == total
    # linked images (relative to the page) load from disk under the page's policy
    browser.evaluate("window.scrollTo(0, 0)")
    src = browser.evaluate("document.querySelector('.card .thumb img').getAttribute('src')")
    assert not src.startswith("data:") and src.endswith(".png")
    browser.wait_for(FIRST_IMAGE_LOADED)
    assert browser.errors == [] and browser.dialogs == []


@pytest.mark.slow
def test_a_training_run_groups_rollouts_by_prompt_sorted_by_advantage(browser, demo_run, tmp_path):
    found = load_inspection(demo_run / "rl" / "full", steps=[1, 3])  # the steps it logged rollouts of
    page = write_page(found, tmp_path / "run.html")
    browser.open(page.as_uri(), wait_for=READY)
    assert browser.evaluate("document.querySelectorAll('.run img').length") == 1  # the curves
    assert browser.evaluate("document.getElementById('ctl-step').value") == "3"  # the last step first
    assert (
        browser.evaluate(CARDS) == 8 and browser.evaluate("document.querySelectorAll('.group').length") == 2
    )
    groups = browser.evaluate(
        "[...document.querySelectorAll('.group')].map(g => { const out = []; let n = g.nextElementSibling;"
        " while (n && n.classList.contains('card')) { out.push(Number(n.dataset.index)); n = n.nextElementSibling; }"
        " return out; })"
    )
    for members in groups:
        assert len({found.cards[i]["group"] for i in members}) == 1
        advantages = [found.cards[i]["advantage"] for i in members]
        assert advantages == sorted(advantages, reverse=True)
    set_control(browser, "step", "1")
    assert browser.evaluate(MATCHING) == 8 and {found.cards[i]["step"] for i in
        browser.evaluate("[...document.querySelectorAll('.card')].map(c => Number(c.dataset.index))")} == {1}  # fmt: skip
    assert browser.errors == [] and browser.dialogs == []
