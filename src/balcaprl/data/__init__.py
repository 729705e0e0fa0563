"""Training data: the on-disk dataset format every producer writes and every trainer reads."""
