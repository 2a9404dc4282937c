#!/usr/bin/env bash
# Packs the project's Python dependencies into one relocatable archive for Spark executors on
# machines that do not have them: ship it with `spark.archives` (docs/operations.md, "Running on a
# Spark cluster"). The project's own code is not in it: the service ships its code to its executors
# at start (service/runtime/project_code.py), so the archive changes only with the dependencies.
# pyspark is left out: each worker's own Spark (the same version) puts its pyspark on the path of the
# Python workers it starts. venv-pack keeps `bin/python` a link to the interpreter this script runs
# with (PYTHON), so workers need that Python at the same path.
# Usage:
#   bash scripts/pack_executor_env.sh OUT.tar.gz
set -euo pipefail
out=$(realpath -m "${1:?usage: pack_executor_env.sh OUT.tar.gz}")
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
mkdir -p "$(dirname "$out")"
"$PYTHON" -m venv "$build/env"
pip=("$build/env/bin/pip" install -q --disable-pip-version-check --no-compile)
# The project's dependencies as pyproject.toml pins them, except pyspark (and delta-spark's
# dependency on it): installing pyspark only to leave it out of the archive costs half the time.
"$build/env/bin/python" - pyproject.toml > "$build/requirements.txt" <<'PY'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    dependencies = tomllib.load(f)["project"]["dependencies"]
print("\n".join(d for d in dependencies if re.split(r"[<>=!~\[ ;]", d)[0].lower() != "pyspark"))
PY
grep -i '^delta-spark' "$build/requirements.txt" > "$build/no-deps.txt" || true
grep -vi '^delta-spark' "$build/requirements.txt" > "$build/with-deps.txt"
{ "${pip[@]}" -r "$build/with-deps.txt" venv-pack==0.2.0
  "${pip[@]}" --no-deps -r "$build/no-deps.txt"; } 2>&1 | grep -v '^WARNING' || true
"$build/env/bin/python" -c "import pyarrow, confluent_kafka, deltalake, fastavro" \
  || { echo "installation failed" >&2; exit 1; }
site=lib/$("$build/env/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages
"$build/env/bin/venv-pack" --prefix "$build/env" --output "$out" --force --quiet --compress-level 1 \
  --exclude "$site/pip/*" --exclude "$site/venv_pack/*" --exclude "bin/venv-pack"
echo "$out"
