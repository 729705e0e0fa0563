"""Training data: the on-disk dataset format, the pieces its producers share, and the producers.

Modules (imported on use; none is loaded by ``import balcaprl.data``):

The format
- ``format``      the dataset folder every producer writes and every trainer reads: parquet splits,
                  images/, the card (``dataset.json``); DatasetSample, TokenCounter, write/read

Shared by producers
- ``validation``  rejection reasons, per-image checks (read, hash, full decode) and thresholds
- ``placement``   existing image files into a dataset folder: hard link, copy or re-encode
- ``split``       the seeded, hash-based train/eval split

Producers
- ``sharegpt4v``  `data prepare sharegpt4v`: a package, one module per idea (``stream`` reads the
                  published JSON, ``entries`` checks one entry, ``checkpoint`` is the resume file,
                  ``prepare`` is the pipeline)
- ``recaption``   `data recaption`: new references from a strong model through the judge machinery

Around them (the commands are in :mod:`balcaprl.cli.data`)
- ``info``        `data info`: statistics, plain-text tables and the reference-length histogram

Long steps report progress through :mod:`balcaprl.progress`.
"""
