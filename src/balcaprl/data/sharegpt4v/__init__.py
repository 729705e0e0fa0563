"""ShareGPT4V -> a balcaprl dataset folder (`balcaprl data prepare sharegpt4v`).

Input, exactly as published on the Hugging Face dataset ``Lin-Chen/ShareGPT4V``: a JSON list of
entries (``sharegpt4v_instruct_gpt4-vision_cap100k.json``, ~102K GPT-4V captions, and
``share-captioner_coco_lcs_sam_1246k_1107.json``, ~1.2M ShareCaptioner captions), with the images
under one root: ``coco/``, ``sam/``, ``llava/``, ``wikiart/``, ``web-celebrity/``, ``web-landmark/``,
``share_textvqa/``.

Output: the dataset format (:mod:`balcaprl.data.format`). ``prompt`` is the human turn without the
``<image>`` tag; ``reference`` and ``reference_original`` are both the gpt turn until re-captioning
(:mod:`balcaprl.data.recaption`) replaces ``reference``.

The modules, one idea each:

- ``stream``      reading the published JSON as a stream (:class:`JsonArrayStream`)
- ``entries``     checking one entry's fields and path (:func:`parse_entry`)
- ``checkpoint``  the resume file of image checks (``OUT/.prepare/image-checks.jsonl``)
- ``prepare``     the pipeline: read, check images, de-duplicate, place, split, write (:func:`prepare_sharegpt4v`)

The shared pieces they use live one level up: :mod:`balcaprl.data.validation` (rejection reasons,
image checks), :mod:`balcaprl.data.placement` (images into the folder), :mod:`balcaprl.data.split`.
"""

from balcaprl.data.sharegpt4v.entries import ParsedEntry, parse_entry
from balcaprl.data.sharegpt4v.prepare import (
    PrepareOptions,
    PrepareReport,
    default_workers,
    prepare_results,
    prepare_sharegpt4v,
)
from balcaprl.data.sharegpt4v.stream import JsonArrayStream

__all__ = [
    "JsonArrayStream",
    "ParsedEntry",
    "PrepareOptions",
    "PrepareReport",
    "default_workers",
    "parse_entry",
    "prepare_results",
    "prepare_sharegpt4v",
]
