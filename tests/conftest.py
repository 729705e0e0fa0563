"""Suite-wide settings.

Hypothesis: in CI (``CI`` set, as every CI service does) the property tests are derandomised, so a
run's result depends on the code alone; locally they draw new examples each run and keep failures
in ``.hypothesis/`` to replay them. ``HYPOTHESIS_PROFILE=ci|dev`` picks one explicitly.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

from balcaprl.outputs import release_output_locks

settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True)
def _release_output_locks():
    """A test that claims an output place in-process lets it go at its end, as a command does."""
    yield
    release_output_locks()
