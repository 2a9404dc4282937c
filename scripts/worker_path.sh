#!/usr/bin/env bash
# Make Spark's Python workers import pyspark and py4j from the environment's site-packages (with
# their compiled bytecode) instead of the zips Spark puts first on their path. Usage:
#   bash scripts/worker_path.sh PYTHON
set -euo pipefail
python=${1:?usage: worker_path.sh PYTHON}
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo 'import sys; sys.path[:] = [p for p in sys.path if "/pyspark/python/lib/" not in p]' \
  > "$site/cdc_lakehouse_worker_path.pth"
