#!/usr/bin/env bash
# Entrypoint of the cdc-lakehouse image. The same image is the service (the Spark driver) and
# the Spark executors and workers it runs on, so every process has the same Python, pyspark
# and project at the same paths:
#   run CONFIG ... | validate CONFIG | status ...   the service (any `cdc-lakehouse` command)
#   executor                                        an executor pod of Spark on Kubernetes (Spark
#                                                   starts it with this argument and SPARK_* env)
#   spark-worker spark://HOST:PORT [ARGS]           a Spark standalone worker joining a master
#   spark-master [ARGS]                             a Spark standalone master
set -euo pipefail
: "${SPARK_HOME:?SPARK_HOME must name the pyspark installation}"

case "${1:-}" in
  executor)
    # The variables are the ones Spark's Kubernetes scheduler sets on every executor pod; its
    # JVM options come as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in that order.
    mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    exec java -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" "${java_opts[@]}" \
      -cp "${SPARK_HOME}/conf:${SPARK_HOME}/jars/*" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  spark-worker)
    shift
    exec "${SPARK_HOME}/bin/spark-class" org.apache.spark.deploy.worker.Worker "$@"
    ;;
  spark-master)
    shift
    exec "${SPARK_HOME}/bin/spark-class" org.apache.spark.deploy.master.Master "$@"
    ;;
  *)
    exec cdc-lakehouse "$@"
    ;;
esac
