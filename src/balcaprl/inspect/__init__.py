"""`balcaprl inspect`: what the judge decided about each caption, as one self-contained HTML page.

    found = load_inspection("runs/demo")          # a scores / evaluation / training / demo folder
    write_page(found, "report.html")              # one file: data, script, style, thumbnails

Modules: ``sources`` (which kind of folder a path is), ``scores`` and ``runs`` (reading scores and
evaluation folders, training and demo runs into cards), ``inspection`` (what they fill), ``cards``
(a verdict's marks and scores), ``images`` (thumbnails or relative links), ``page`` (the HTML and
its safety rules).
"""

from balcaprl.inspect.images import IMAGE_MODES, ImageMode, ImageTable
from balcaprl.inspect.inspection import Inspection, RunView
from balcaprl.inspect.page import page_data, render_page, write_page
from balcaprl.inspect.sources import load_inspection

__all__ = [
    "IMAGE_MODES",
    "ImageMode",
    "ImageTable",
    "Inspection",
    "RunView",
    "load_inspection",
    "page_data",
    "render_page",
    "write_page",
]
