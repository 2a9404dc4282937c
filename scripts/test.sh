#!/usr/bin/env bash
# Install (with test extras), then run the whole test suite. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` to leave out the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
# Two workers: one runs every module that needs the Spark session, the other the rest (tests/conftest.py).
exec .venv/bin/python -m pytest -n "${CDC_TEST_WORKERS:-2}" --dist loadscope "$@"
