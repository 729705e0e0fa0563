"""``python -m balcaprl``: the same command line as the ``balcaprl`` script."""

from balcaprl.cli import app

app(prog_name="balcaprl")
