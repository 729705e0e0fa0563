"""``balcaprl demo``: the whole loop offline on a CPU, and the paper's ablations in miniature.

- :mod:`~balcaprl.demo.config` the demo's settings, every default declared there once
- :mod:`~balcaprl.demo.variants` the ablation variants, each a few recipe overrides
- :mod:`~balcaprl.demo.pipeline` build -> SFT -> eval -> RL -> eval -> report, resumable per stage
- :mod:`~balcaprl.demo.report` paired bootstrap, tables (rich, Markdown, CSV), training curves
- :mod:`~balcaprl.demo.cli` the ``demo`` command (``register(app)``)

Heavy modules (torch, transformers, TRL) are imported only when a stage runs.
"""
