"""The test run's one random seed, next to the fixed seed lists of the randomised tests.

Chosen once per run and handed to every pytest-xdist worker through `CDC_TEST_RUN_SEED` (the
controller sets it in `tests/conftest.py` before the workers start): the workers must collect the
same test ids, and the seed is part of the ids. `CDC_TEST_RUN_SEED=<n>` replays a run's seed.
"""

from __future__ import annotations

import os
import random

ENV = "CDC_TEST_RUN_SEED"


def choose() -> int:
    """The run's seed: the one in the environment, else a new one put there for the processes to come."""
    if not os.environ.get(ENV):
        os.environ[ENV] = str(random.SystemRandom().randrange(2**32))
    return int(os.environ[ENV])


def run_seed(bound: int) -> int:
    """The run's seed below `bound` (the same in every worker of the run)."""
    return choose() % bound
