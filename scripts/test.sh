#!/usr/bin/env bash
# Install (with test extras), then run the whole test suite. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m "not slow"` to leave out the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
exec .venv/bin/python -m pytest "$@"
