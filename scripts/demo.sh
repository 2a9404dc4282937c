#!/usr/bin/env bash
# Install, then run the service on its embedded defaults: local broker, local Spark, local Delta.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh demo
exec .venv/bin/cdc-lakehouse demo "$@"
