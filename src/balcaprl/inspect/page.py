"""The HTML page: one file, no network, the data as one JSON block that the page's script renders.

Safety with untrusted text (captions, references, judge answers, file names): the only place data
enters the markup is the JSON block, ``<script type="application/json">``, with ``<``, ``>``, ``&``
and the two JavaScript line separators written as ``\\uXXXX`` escapes, so no text can close the block
or open a tag; the script sets every text with ``textContent``. A Content-Security-Policy allows only
the page's own script and style (by their sha256) and images from data URLs and files, so even a
mistake in either would not run injected code or reach the network.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import html
import json
import math
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from balcaprl.files import atomic_write_text
from balcaprl.inspect.images import ImageMode
from balcaprl.inspect.inspection import Inspection, RunView

# Figures of a run's last logged step shown under its curves: (metrics.jsonl key, label, format).
RUN_FACTS = (
    ("rewards/precision/mean", "precision", ".3f"),
    ("rewards/recall/mean", "recall", ".3f"),
    ("rewards/linguistic/mean", "linguistic (after length mask)", ".3f"),
    ("rewards/linguistic_unmasked/mean", "linguistic (judge, unmasked)", ".3f"),
    ("length/caption_tokens_mean", "caption tokens", ".1f"),
    ("length/masked_share", "masked", ".0%"),
    ("judge/failures", "judge failures", ".0f"),
)
# A caption assertion's status as the page data writes it (the script maps it back).
STATUS_CODES = {"verified": "v", "hallucinated": "h", "meta": "m"}
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element: nothing in it can end the element."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.translate(str.maketrans(_JSON_ESCAPES))


def _asset(name: str) -> str:
    return resources.files("balcaprl.inspect").joinpath("assets", name).read_text(encoding="utf-8")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def _compact(cards: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Cards with references and assertion texts as indices into one string table (a reference and
    its assertions repeat on every caption of its image), and assertion statuses as one letter."""
    strings: list[str] = []
    index: dict[str, int] = {}

    def intern(text: str) -> int:
        found = index.get(text)
        if found is None:
            found = index[text] = len(strings)
            strings.append(text)
        return found

    out = []
    for card in cards:
        card = dict(card)
        if card.get("reference") is not None:
            card["reference"] = intern(card["reference"])
        if card.get("ca") is not None:
            card["ca"] = [[intern(text), STATUS_CODES[status]] for text, status in card["ca"]]
        if card.get("ra") is not None:
            card["ra"] = [[intern(text), covered] for text, covered in card["ra"]]
        out.append(card)
    return out, strings


def _run_facts(run: RunView) -> str:
    parts = []
    if run.steps_logged:
        shown = ", ".join(map(str, run.steps_shown)) or "none"
        parts.append(f"rollouts logged at {len(run.steps_logged)} step(s); on this page: step {shown}")
    last = run.last_metrics
    if last:
        figures = [
            f"{label} {format(last[key], spec)}"
            for key, label, spec in RUN_FACTS
            if isinstance(last.get(key), int | float) and math.isfinite(last[key])
        ]
        parts.append(f"last judged step ({last.get('step')}): " + (", ".join(figures) or "no figures logged"))
    return " · ".join(parts)


def page_data(
    found: Inspection,
    page: Path,
    image_mode: ImageMode = "auto",
    *,
    thumbnail_side: int = 192,
    embed_limit: int = 2000,
    on_image: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """The page's JSON data (images resolved for a page written to ``page``). Cards as
    :mod:`balcaprl.inspect.cards` describes them, except that ``reference`` and assertion texts are
    indices into ``strings`` and assertion statuses are letters (:data:`STATUS_CODES`)."""
    runs = [
        {
            "label": run.label,
            "curves": None
            if run.curves_png is None
            else "data:image/png;base64," + base64.b64encode(run.curves_png).decode("ascii"),
            "facts": _run_facts(run),
        }
        for run in found.runs
    ]
    images = found.images.sources(
        page, image_mode, max_side=thumbnail_side, embed_limit=embed_limit, on_image=on_image
    )
    cards, strings = _compact(found.cards)
    return {
        "title": found.title,
        "kind": found.kind,
        "generated": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "sources": found.sources,
        "notes": found.notes,
        "runs": runs,
        "images": images,
        "strings": strings,
        "cards": cards,
    }


def render_page(data: dict[str, Any]) -> str:
    """The whole HTML document for ``data`` (see :func:`page_data`)."""
    style, script = _asset("page.css"), _asset("page.js")
    policy = (
        f"default-src 'none'; script-src {_csp_hash(script)}; style-src {_csp_hash(style)}; "
        "img-src data: file: 'self'; base-uri 'none'; form-action 'none'"
    )
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{html.escape(policy)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>balcaprl inspect: {html.escape(str(data['title']))}</title>\n"
        f"<style>{style}</style>\n</head>\n<body>\n"
        f'<script type="application/json" id="balcaprl-data">{script_json(data)}</script>\n'
        f"<script>{script}</script>\n</body>\n</html>\n"
    )


def write_page(found: Inspection, out: Path | str, image_mode: ImageMode = "auto", **options: Any) -> Path:
    """Write the page for ``found`` to ``out`` (atomically) and return its path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render_page(page_data(found, out, image_mode, **options)))
    return out
