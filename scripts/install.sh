#!/usr/bin/env bash
# Installs what cdc-lakehouse needs on a fresh Debian/Ubuntu machine: Java 17 for Spark and
# a virtualenv (.venv) with the project. Pass "test" to include the test extras, "demo" for the
# embedded broker of `cdc-lakehouse demo` (the tests use it too).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ]; then
  echo "installing Java 17 (Spark needs it)" >&2
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi
# The JVM components of the test suite (Apache Kafka, Kafka Connect + Debezium, the Delta jars, the
# registry) come from Maven Central through Maven, resolved once into ~/.cache/cdc-lakehouse/jars.
if [ "${1:-}" = "test" ] && ! command -v mvn >/dev/null; then
  echo "installing Maven (the test suite's JVM components come from Maven Central)" >&2
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
fi
# The real change-capture tests run a private PostgreSQL cluster (any version with pg_ctl).
if [ "${1:-}" = "test" ] && ! compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
  echo "installing PostgreSQL (the change-capture tests need it)" >&2
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v '^WARNING' || true
extras=""
[ "${1:-}" = "test" ] && extras="[test,demo]"
[ "${1:-}" = "demo" ] && extras="[demo]"
.venv/bin/pip install -q --disable-pip-version-check -e ".${extras}" 2>&1 | grep -v '^WARNING' || true
# Spark puts its pyspark.zip and py4j zip first on the path of every Python worker it starts, and
# Python compiles pyspark from a zip anew each time (measured: 7.7 s against 1.5 s from the venv on
# a loaded 2-core machine, while Spark gives a new worker a fixed 10 s to connect back). The same
# versions are installed in the venv: this .pth file drops the zips so workers import those.
bash scripts/worker_path.sh .venv/bin/python
.venv/bin/python -c "import service, connectors, pyspark, deltalake, confluent_kafka" \
  || { echo "installation failed" >&2; exit 1; }
# Apache Kafka (the test broker), the Delta jars (delta-spark), Kafka Connect with the Debezium
# PostgreSQL connector, Apicurio Registry: resolved once per machine (connectors/maven_jars.py).
if [ "${1:-}" = "test" ]; then
  .venv/bin/python -m connectors.maven_jars resolve kafka delta connect apicurio
fi
# The local Spark JVM's class archive (service/runtime/jvm_class_archive.py): about 3 s off every start.
# Written once per Java runtime and Spark version (about 50 s; `prepare` pins the jars' times, so a
# reinstall of the same Spark keeps it); a failure only costs the gain.
.venv/bin/cdc-lakehouse prepare 2>&1 | tail -1 || true
