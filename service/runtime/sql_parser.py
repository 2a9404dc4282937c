"""Spark SQL expressions of a config compiled with Spark's own parser, before anything starts
(`cdc-lakehouse validate` and `plan`).

A pipeline's `columns:` holds Spark SQL text (computed columns, a row filter). Spark's parser lives in
the JVM, so the check starts one: pyspark's gateway alone (no SparkContext, no executors, no session),
mapping the prepared class archive like the service's driver, and only when some pipeline has an
expression. It parses with `SparkSqlParser`, the parser of the service's sessions (Delta's SQL
extension hands expressions to it), so a text accepted here parses the same when the pipeline starts.
Resolving the columns needs the source's schema, which is known only from its records: that stays the
first batch's job (`kafka_to_delta/sink/column_rules.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from service.config.settings import Settings
from service.runtime.jvm_class_archive import session_options

_LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def expressions_of(settings: Settings) -> list[tuple[str, str, str]]:
    """Every Spark SQL expression of `settings`: (pipeline, the column or `filter` it is for, its text)."""
    return [(pipeline.name, name, text) for pipeline in settings.pipelines if pipeline.columns is not None
            for name, text in pipeline.columns.expressions().items()]


def _reason(error: Exception) -> str:
    """The first line of the JVM's message (Spark's error class and position), else the error's own."""
    java = getattr(error, "java_exception", None)
    message = str(java.getMessage()) if java is not None else str(error)
    return next((line.strip() for line in message.splitlines() if line.strip()), type(error).__name__)


def compile_problems(settings: Settings) -> list[str]:
    """Why each expression of `settings` does not compile, naming the pipeline and the column ([]: all do)."""
    named = expressions_of(settings)
    if not named:
        return []
    from py4j.protocol import Py4JJavaError
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    options = f"-Dlog4j.configurationFile=file:{_LOG4J_CONFIG} {session_options()}".strip()
    gateway = launch_gateway(SparkConf(loadDefaults=False).set("spark.driver.extraJavaOptions", options))
    try:
        parser = gateway.jvm.org.apache.spark.sql.execution.SparkSqlParser()
        problems = []
        for pipeline, name, text in named:
            try:
                parser.parseExpression(text)
            except Py4JJavaError as error:
                problems.append(f"pipeline {pipeline}: columns: {name}: {text!r} does not compile: {_reason(error)}")
        return problems
    finally:
        gateway.shutdown()
