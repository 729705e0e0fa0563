"""`balcaprl inspect`: what the judge decided about each caption, as one self-contained HTML page.

    found = load_inspection("runs/demo")          # a scores / evaluation / training / demo folder
    write_page(found, "report.html")              # one file: data, script, style, thumbnails

Modules: ``sources`` (reading each kind of folder into cards), ``cards`` (a verdict's marks and
scores), ``images`` (thumbnails or relative links), ``page`` (the HTML and its safety rules).
"""

from balcaprl.inspect.images import IMAGE_MODES, ImageMode, ImageTable
from balcaprl.inspect.page import page_data, render_page, write_page
from balcaprl.inspect.sources import InspectError, Inspection, RunView, load_inspection

__all__ = [
    "IMAGE_MODES",
    "ImageMode",
    "ImageTable",
    "InspectError",
    "Inspection",
    "RunView",
    "load_inspection",
    "page_data",
    "render_page",
    "write_page",
]
