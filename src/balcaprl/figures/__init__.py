"""Figures of the paper, reproduced from the library's own functions."""
