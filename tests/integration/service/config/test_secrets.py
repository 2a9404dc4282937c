"""Secrets stay masked where they can appear: the settings in the log, Spark's plans and UI, the CLI."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

from connectors.kafka.source import FORMAT_NAME, KafkaSource
from service.config.settings import _SECRET_HINTS, settings_from_mapping
from service.runtime.spark_session import _REDACTION

CLI = str(Path(sys.executable).with_name("cdc-lakehouse"))
SECRETS = {
    "sasl.password": "hunter2-pw",
    "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule password="hunter3-jaas"',
    "ssl.key.pem": "-----BEGIN PRIVATE KEY----- hunter4-pem",
    "ssl.key.password": "hunter5-key",
    "sasl.oauthbearer.client.secret": "hunter6-oauth",
    "sasl.oauthbearer.config": "clientSecret=hunter7-oauthcfg",
}


def test_the_logged_kafka_settings_mask_every_secret() -> None:
    settings = settings_from_mapping({"kafka": {"bootstrap_servers": "b:9092", "options": SECRETS}})
    shown = str(settings.kafka.redacted())
    assert "b:9092" in shown and not any(value in shown for value in SECRETS.values()), shown


def test_spark_redaction_covers_every_secret_key() -> None:
    """Spark's UI (environment page) and logs mask conf values whose keys match spark.redaction.regex."""
    for key in [*SECRETS, *(f"spark.hadoop.fs.s3a.{hint}" for hint in _SECRET_HINTS)]:
        assert re.search(_REDACTION, key), key


def test_query_plans_mask_kafka_and_storage_secrets(spark) -> None:
    spark.dataSource.register(KafkaSource)
    reader = spark.readStream.format(FORMAT_NAME).option("bootstrap.servers", "127.0.0.1:1").option("topics", "t")
    for key, value in SECRETS.items():
        reader = reader.option(f"kafka.{key}", value)
    frame = reader.option("storageOptions", '{"aws_secret_access_key": "hunter8-aws"}').load()
    printed = io.StringIO()
    with redirect_stdout(printed):
        frame.explain(True)
    plan = printed.getvalue()
    assert "kafka.sasl.password=*********(redacted)" in plan, plan
    assert "hunter" not in plan, plan


def test_validate_errors_do_not_echo_secret_values(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "kafka:\n  options: {sasl.password: hunter9-pw, sasl.mechanism: [not, a, string]}\n"
        "pipelines:\n  - {name: p, topics: [t], table: t, primary_key: [id], unknown: hunter10}\n"
    )
    done = subprocess.run([CLI, "validate", str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "kafka.options.sasl.mechanism" in done.stderr, done.stderr
    assert "hunter" not in done.stderr + done.stdout
