"""Training data: the on-disk dataset format every producer writes and every trainer reads.

Modules (imported on use; none is loaded by ``import balcaprl.data``):

- ``format``      the pinned dataset folder: parquet splits, images/, the card (``dataset.json``)
- ``sharegpt4v``  `balcaprl prepare sharegpt4v`: streaming JSON reader, validation, dedup, split
- ``validation``  rejection reasons, per-image checks (process pool) and their resumable checkpoint
- ``split``       the seeded, hash-based train/eval split
- ``recaption``   `balcaprl recaption`: new references from a strong model through the judge machinery
- ``info``        `balcaprl data info`: statistics and the reference-length histogram
- ``fixture``     a generated stand-in for ShareGPT4V in its exact layout (tests, benchmark)
- ``cli``         the commands, added to the main app by ``register(app)``
"""
