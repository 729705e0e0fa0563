"""Shared helpers for the inspect and audit tests (a uniquely named module, imported by the test files)."""

from __future__ import annotations

import os

import pytest

# Captions that try to break out of the page: the test checks they stay text.
HOSTILE = (
    "A red shape </script><script>alert(1)</script> on white.",
    'A shape <img src=x onerror="alert(2)"> and \u2028 a line separator & an ampersand.',
)
REQUIRE_BROWSER = "BALCAPRL_REQUIRE_BROWSER"


def need_browser() -> str:
    """The Chromium executable; skips the test when there is none, but fails where one is required (CI)."""
    from balcaprl.testing.browser import find_chromium

    path = find_chromium()
    if path is None:
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(f"{REQUIRE_BROWSER}=1 but no Chromium is installed (apt-get install chromium)")
        pytest.skip(
            "no Chromium on this machine (apt-get install chromium); CI sets BALCAPRL_REQUIRE_BROWSER=1"
        )
    return path
