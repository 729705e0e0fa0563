"""`balcaprl caption`: a captioning model's captions for a benchmark's images (or any folder/dataset).

Backends:
- ``transformers`` (default): ``AutoModelForImageTextToText`` + ``AutoProcessor`` from a local folder
  or a hub id, batched (left padding), on CUDA when available, else CPU. Any model whose processor
  has a chat template with an image part works (LLaVA, Qwen2.5-VL, the synthetic tiny policy).
- ``vllm`` (the ``[vllm]`` extra; GPUs): ``vllm.LLM(...).chat`` with the image as a data URL; much
  faster for the 600-image CapArena set or a 7B model. Imported only when asked for.

Sources (what to caption):
- a balcaprl dataset folder (``dataset.json``): the rows of ``--split`` (key = the image's path in the
  dataset folder, e.g. ``images/x.png``; the row's own prompt with ``--prompt dataset``);
- a plain image folder: every image under it (key = its path relative to the folder);
- a benchmark (``--benchmark``): ``decapbench`` (annotation JSONL + image folder; key = image name),
  ``captionqa`` (question file with embedded images, or + an image folder; key = id), ``caparena``
  (``caparena_auto_600.json`` or just the image folder; key = the ``test_XXXXX.jpg`` name).
  A CaptionQA entry with several images (views of one scene) is captioned from all of them
  (``multi_image="lmms-eval"``, the default: lmms-eval's official task), or from all of them with the
  line saying how many that the benchmark's own captioning script puts before the prompt
  (``"captionqa"``: that line is read from a checkout of the benchmark's repository, see
  :func:`balcaprl.evaluate.official.load_captionqa_multi_image_line`), or from the first only
  (``"first"``).

Output: ``OUT`` (JSONL: key, image, caption, benchmark, model, prompt, generation settings), plus the
benchmark's own input format next to it — ``OUT-stem.decapbench.jsonl`` (``image_path``,
``image_name``, ``caption``, ``oracle_caption``), ``OUT-stem.captionqa.json`` (``{id: caption}``),
``OUT-stem.caparena.json`` (``{"test_XXXXX.jpg": caption}``), or ``OUT-stem.json`` (``{key:
caption}``) for a folder or dataset. Resumable: finished captions are appended to ``OUT.part`` as
each batch ends; a re-run with the same model, prompt and sampling skips them (a different set-up
is refused, so one file never mixes two runs); the final files are written atomically at the end.
``balcaprl caption`` refuses an ``OUT`` (or ``OUT.part``) that exists unless ``--resume`` (continue:
also a finished ``OUT``, whose captions are kept) or ``--overwrite`` (start again) is given.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from balcaprl.errors import InputError
from balcaprl.files import JsonlLog, atomic_write_text
from balcaprl.model_paths import check_model_path

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}
# Detailed-description prompts. "detailed" is the caption prompt of lmms-eval's CaptionQA task and
# the synthetic world's prompt; "dataset" uses each dataset row's own prompt (ShareGPT4V's prompts
# for a prepared dataset). Any other text given to --prompt is used as is.
PROMPT_PRESETS: dict[str, str | None] = {
    "detailed": "Describe this image in detail.",
    "dataset": None,
}


# The default caption length, from the judge's bound on one claim (``MAX_ASSERTION_CHARS`` in
# judge/schemas.py: 1,000 characters, past which a verdict is an ``oversized_answer``). A caption that
# never ends a sentence is judged as one claim, so the whole caption must fit that bound; English text
# runs at about 4 characters per token in the BPE tokenizers of the paper's models, so 1,000 // 4 =
# 250 tokens. The paper's captions (~200 tokens, Tables 3 and 4) fit within it.
CHARS_PER_TOKEN = 4
MAX_CLAIM_CHARS = 1000  # = balcaprl.judge.schemas.MAX_ASSERTION_CHARS (a test holds them equal)
DEFAULT_MAX_NEW_TOKENS = MAX_CLAIM_CHARS // CHARS_PER_TOKEN


class GenerationSettings(BaseModel):
    """Sampling: greedy by default (temperature 0), as captioning benchmarks are usually run."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1)
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = Field(0, description="Seed for sampling (ignored when greedy).")
    batch_size: int = Field(8, ge=1)


MultiImage = Literal["captionqa", "lmms-eval", "first"]


@dataclass(frozen=True)
class CaptionItem:
    key: str  # the benchmark's own key for the image
    image: Path | bytes
    prompt: str | None = None  # the row's own prompt (datasets)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. DeCapBench's oracle_caption
    more_images: tuple[Path | bytes, ...] = ()  # the further images of a multi-image entry
    prompt_prefix: str = ""  # put before the prompt (a multi-image entry's count line)

    @property
    def images(self) -> tuple[Path | bytes, ...]:
        return (self.image, *self.more_images)

    @property
    def image_label(self) -> str:
        labels = [str(i) if isinstance(i, Path) else "<embedded>" for i in self.images]
        return labels[0] if len(labels) == 1 else f"{labels[0]} (+{len(labels) - 1} more)"


def resolve_prompt(prompt: str) -> str | None:
    """A preset's text, or ``prompt`` itself; None means "each row's own prompt"."""
    return PROMPT_PRESETS.get(prompt, prompt)


def _images_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def collect_items(
    images: Path | None,
    *,
    benchmark: Literal["decapbench", "captionqa", "caparena"] | None = None,
    annotations: Path | None = None,
    split: str = "eval",
    limit: int | None = None,
    multi_image: MultiImage = "lmms-eval",
    multi_image_line: str | None = None,
) -> list[CaptionItem]:
    """What to caption, in a stable order (see the module docstring). ``multi_image_line``: the
    ``{n}`` template that ``multi_image="captionqa"`` puts before the prompt."""
    from balcaprl.evaluate.formats import read_caparena, read_captionqa, read_decapbench

    if benchmark is not None and images is not None and not Path(images).is_dir():
        raise InputError(f"--images {images} is not a folder")
    items: list[CaptionItem]
    if benchmark == "decapbench":
        if annotations is None or images is None:
            raise InputError(
                "--benchmark decapbench needs --annotations (the JSONL) and --images (the folder)"
            )
        items = [
            CaptionItem(i.key, Path(images) / i.key, extra={"oracle_caption": i.oracle_caption})
            for i in read_decapbench(annotations)
        ]
    elif benchmark == "captionqa":
        if annotations is None:
            raise InputError("--benchmark captionqa needs --annotations (the question file)")
        items = []
        for entry in read_captionqa(annotations):
            found: list[Path | bytes] = []
            for image in entry.images:
                if isinstance(image, bytes):
                    found.append(image)
                elif images is not None and (Path(images) / image).is_file():
                    found.append(Path(images) / image)
            if not found and images is not None:
                candidates = [Path(images) / f"{entry.id}{s}" for s in (".jpg", ".png", ".jpeg")]
                found = [c for c in candidates if c.is_file()][:1]
            if not found:
                raise InputError(f"CaptionQA entry {entry.id}: no embedded image and none under --images")
            if multi_image == "first":
                found = found[:1]
            if multi_image == "captionqa" and multi_image_line is None:
                raise InputError(
                    "--multi-image captionqa needs the benchmark's count line: give --official-captionqa-repo "
                    "(a checkout of the CaptionQA repository), or use --multi-image lmms-eval"
                )
            prefix = (
                multi_image_line.format(n=len(found))
                if multi_image == "captionqa" and multi_image_line is not None and len(found) > 1
                else ""
            )
            items.append(CaptionItem(entry.id, found[0], more_images=tuple(found[1:]), prompt_prefix=prefix))
    elif benchmark == "caparena":
        if images is None:
            raise InputError("--benchmark caparena needs --images (the DOCCI image folder)")
        names = [i.image for i in read_caparena(annotations)] if annotations else None
        if names is None:
            names = [p.relative_to(images).as_posix() for p in _images_under(Path(images))]
        items = [CaptionItem(n, Path(images) / n) for n in names]
    elif benchmark is None:
        if images is None:
            raise InputError("give --images (a folder of images or a balcaprl dataset) or --benchmark")
        root = Path(images)
        if (root / "dataset.json").is_file():
            from balcaprl.data.format import read_split_rows

            # key: the image's path in the dataset folder, as the references of `score` and the
            # benchmark files name it (a row id matched neither)
            items = [
                CaptionItem(r["image"], Path(r["image_path"]), prompt=r["prompt"])
                for r in read_split_rows(root, split)
            ]
        elif root.is_dir():
            items = [CaptionItem(p.relative_to(root).as_posix(), p) for p in _images_under(root)]
            if not items:
                raise InputError(f"{root} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        else:
            raise InputError(f"--images {root} is not a folder")
    else:
        raise InputError(f"unknown benchmark {benchmark!r}; choose decapbench, captionqa or caparena")
    return items[:limit] if limit is not None else items


def _load_pil(item: CaptionItem, image: Path | bytes | None = None):
    """``image`` (default: the item's first) at full size (the model's processor resizes it as the model
    expects), within the pixel limit every command applies; a missing or broken image names the item."""
    from balcaprl.images import ImageReadError, open_image

    source = item.image if image is None else image
    try:
        return open_image(source, mode="RGB", where=f"the image of {item.key!r} ({item.image_label})")
    except ImageReadError as error:
        raise InputError(f"{error}; fix or remove it, then run again with --resume") from None


class TransformersCaptioner:
    """Batched generation with ``transformers`` (CPU or GPU)."""

    name = "transformers"

    def __init__(self, model: str | Path, *, device: str = "auto", dtype: str = "auto"):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        self.model_id = str(model)
        self.device = device
        self.dtype = torch_dtype
        check_model_path(model, "--model")  # a mistyped local path is not sent to the hub
        try:
            self.model = (
                AutoModelForImageTextToText.from_pretrained(model, dtype=torch_dtype).to(device).eval()
            )
            self.processor = AutoProcessor.from_pretrained(model)
        except (OSError, ValueError) as error:  # not a checkpoint, not on the hub, or offline
            raise InputError(
                f"--model {model}: cannot load an image-text model from it ({str(error).splitlines()[0]}); "
                "give a checkpoint folder (config.json, weights, processor files) or a hub id"
            ) from None
        tokenizer = getattr(self.processor, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.padding_side = "left"  # decoder-only batched generation continues on the right

    def generate(
        self, images: Sequence[Any], prompts: Sequence[str], settings: GenerationSettings
    ) -> list[str]:
        import torch

        # an element of `images` is one image, or the list of a multi-image entry's images
        groups = [list(im) if isinstance(im, list | tuple) else [im] for im in images]
        texts = [
            self.processor.apply_chat_template(
                [{"role": "user", "content": [*[{"type": "image"}] * len(g), {"type": "text", "text": p}]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for g, p in zip(groups, prompts, strict=True)
        ]
        flat = [image for group in groups for image in group]
        batch = self.processor(text=texts, images=flat, return_tensors="pt", padding=True).to(self.device)
        if "pixel_values" in batch:
            batch["pixel_values"] = batch["pixel_values"].to(self.dtype)
        sampling = settings.temperature > 0
        if sampling:
            torch.manual_seed(settings.seed)
        with torch.no_grad():
            out = self.model.generate(
                **batch,
                max_new_tokens=settings.max_new_tokens,
                do_sample=sampling,
                temperature=settings.temperature if sampling else None,
                top_p=settings.top_p if sampling else None,
                top_k=None,
            )
        new = out[:, batch["input_ids"].shape[1] :]
        return [t.strip() for t in self.processor.batch_decode(new, skip_special_tokens=True)]


class VLLMCaptioner:
    """Generation with vLLM (``pip install 'balcaprl[vllm]'``, GPUs). ``engine_args`` go to ``vllm.LLM``
    (e.g. ``tensor_parallel_size``, ``max_model_len``; ``limit_mm_per_prompt={"image": n}`` for entries
    with up to n images)."""

    name = "vllm"

    def __init__(self, model: str | Path, **engine_args: Any):
        try:
            from vllm import LLM
        except ImportError as error:
            raise InputError(
                f"the vllm backend needs vLLM ({error}); install it with `pip install -e '.[trl,vllm]' -c constraints/gpu-one-node.txt` "
                "on a GPU machine, or use --backend transformers"
            ) from None
        self.model_id = check_model_path(model, "--model")
        engine_args.setdefault("limit_mm_per_prompt", {"image": 1})
        self.llm = LLM(model=str(model), **engine_args)

    def generate(
        self, images: Sequence[Any], prompts: Sequence[str], settings: GenerationSettings
    ) -> list[str]:
        import base64

        from vllm import SamplingParams

        conversations = []
        for image, prompt in zip(images, prompts, strict=True):
            parts = []
            for one in image if isinstance(image, list | tuple) else [image]:
                buffer = io.BytesIO()
                one.save(buffer, format="PNG")
                url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
                parts.append({"type": "image_url", "image_url": {"url": url}})
            conversations.append([{"role": "user", "content": [*parts, {"type": "text", "text": prompt}]}])
        params = SamplingParams(
            temperature=settings.temperature, top_p=settings.top_p, max_tokens=settings.max_new_tokens,
            seed=settings.seed,
        )  # fmt: skip
        outputs = self.llm.chat(conversations, params, use_tqdm=False)
        return [o.outputs[0].text.strip() for o in outputs]


def native_path(out: Path, benchmark: str | None) -> Path:
    """Where the benchmark's own input format is written next to ``out``."""
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.stem
    suffix = {"decapbench": ".decapbench.jsonl", "captionqa": ".captionqa.json", "caparena": ".caparena.json"}
    return out.with_name(stem + suffix.get(benchmark or "", ".json"))


@dataclass
class CaptionRun:
    out: Path
    native: Path
    rows: list[dict[str, Any]]
    generated: int  # captions made by this run (the rest came from OUT.part)


def _run_id(
    model: str, prompt: str | None, backend: str, settings: GenerationSettings, images: dict[str, Any]
) -> str:
    signature = {"model": model, "prompt": prompt, "backend": backend,
                 **settings.model_dump(exclude={"batch_size"})}  # fmt: skip
    if any(images.values()):  # multi-image entries: how they were sent is part of the run
        signature["images"] = images
    return hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:16]


def _read_done(path: Path, run_id: str) -> dict[str, dict[str, Any]]:
    """Captions already made by this run: the rows of ``OUT.part`` (an unfinished run) or of ``OUT``
    (a finished one, for ``--resume``); rows of a different run are refused, so files never mix."""
    done = {}
    for row in JsonlLog(path).read():
        if row.get("run_id") != run_id:
            raise InputError(
                f"{path} holds captions of a different run (model, prompt or sampling differ); "
                "finish that run, or pass --overwrite to start over"
            )
        done[row["key"]] = row
    return done


def caption_items(
    items: Sequence[CaptionItem],
    captioner: Any,
    out: Path,
    *,
    prompt: str = "detailed",
    benchmark: str | None = None,
    settings: GenerationSettings | None = None,
    overwrite: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> CaptionRun:
    """Caption ``items`` with ``captioner`` (anything with ``generate(images, prompts, settings)``,
    ``name`` and ``model_id``); write the files; resume from ``OUT.part``."""
    settings = settings or GenerationSettings()
    out = Path(out)
    text = resolve_prompt(prompt)
    if text is None and any(i.prompt is None for i in items):
        raise InputError("--prompt dataset needs a balcaprl dataset (its rows carry their prompts)")
    multi = {i.key: [len(i.images), i.prompt_prefix] for i in items if len(i.images) > 1 or i.prompt_prefix}
    run_id = _run_id(captioner.model_id, text, captioner.name, settings, multi)
    part = out.with_name(out.name + ".part")
    if overwrite:
        part.unlink(missing_ok=True)
    done = {} if overwrite or not out.is_file() else _read_done(out, run_id)  # a finished run
    done.update(_read_done(part, run_id))
    todo = [i for i in items if i.key not in done]
    generation = settings.model_dump(exclude={"batch_size"})
    if on_progress is not None:
        on_progress(len(items) - len(todo), len(items))
    out.parent.mkdir(parents=True, exist_ok=True)
    with JsonlLog(part, sync_every=settings.batch_size) as record:  # fsynced once per batch
        for batch in _batches(todo, settings.batch_size):
            prompts = [i.prompt_prefix + (text if text is not None else (i.prompt or "")) for i in batch]
            pictures = [
                _load_pil(i) if not i.more_images else [_load_pil(i, image) for image in i.images]
                for i in batch
            ]
            captions = captioner.generate(pictures, prompts, settings)
            for item, caption, used in zip(batch, captions, prompts, strict=True):
                row = {"key": item.key, "image": item.image_label, "caption": caption, "benchmark": benchmark,
                       "model": captioner.model_id, "backend": captioner.name, "prompt": used,
                       "generation": generation, "run_id": run_id}  # fmt: skip
                done[item.key] = row
                record.append(row)
            record.sync()
            if on_progress is not None:
                on_progress(len(done), len(items))
    rows = [done[i.key] for i in items]
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    native = native_path(out, benchmark)
    atomic_write_text(native, _native_text(items, rows, benchmark))
    part.unlink(missing_ok=True)
    return CaptionRun(out, native, rows, generated=len(todo))


def _native_text(items: Sequence[CaptionItem], rows: Sequence[dict[str, Any]], benchmark: str | None) -> str:
    if benchmark == "decapbench":
        lines = [
            {
                "image_path": r["key"],
                "image_name": PurePosixPath(r["key"]).name,
                "caption": r["caption"],
                "oracle_caption": i.extra.get("oracle_caption"),
            }  # fmt: skip
            for i, r in zip(items, rows, strict=True)
        ]
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    return json.dumps({r["key"]: r["caption"] for r in rows}, indent=2, ensure_ascii=False) + "\n"


def _batches(items: Sequence[CaptionItem], size: int) -> Iterator[list[CaptionItem]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
