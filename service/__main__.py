"""Command line: `cdc-lakehouse run | validate | plan | rebuild-state | status | demo`.

Exit codes: 0 done (stopped by SIGTERM/SIGINT, or idle with --until-idle); 1 a terminal error
(bad config, bad input, data loss: running again gives the same error, do not restart);
75 (EX_TEMPFAIL) a transient failure outlasted `recovery.max_attempts` restarts (broker away
too long: running again later may succeed). The error is printed as one line on stderr.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NoReturn

import typer

from service.config.settings import load_settings
from service.observability.log_format import configure_logging
from vocabulary.errors import CdcLakehouseError, ConfigError, TransientError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
EXIT_TERMINAL = 1
EXIT_TRANSIENT = 75


def _setup_logging(verbose: bool) -> None:
    configure_logging(verbose)


def _fail(error: CdcLakehouseError, json_logs: bool = False) -> NoReturn:
    if json_logs:
        logging.getLogger("service").error("%s", error)
    else:
        typer.echo(f"error: {error}", err=True)
    raise typer.Exit(EXIT_TRANSIENT if isinstance(error, TransientError) else EXIT_TERMINAL)


@app.command()
def run(
    config: Path = typer.Argument(..., help="YAML config file"),
    until_idle: bool = typer.Option(False, "--until-idle", help="process what is available now, then exit 0"),
    plan: Path = typer.Option(None, "--plan", help="a compiled plan (cdc-lakehouse plan): its state TTLs win"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the configured pipelines until SIGTERM/SIGINT (or until idle)."""
    from service.kafka_to_delta.plan.compiled_plan import apply_plan, read_plan
    from service.supervisor.runner import run as run_service

    try:
        settings = load_settings(config)
        if plan is not None:
            from service.kafka_to_delta.database.tables import expanded

            settings = apply_plan(expanded(settings), read_plan(plan), source=str(plan))
    except CdcLakehouseError as error:
        _fail(error)
    configure_logging(verbose, settings.log_format)
    try:
        run_service(settings, until_idle=until_idle)
    except CdcLakehouseError as error:
        _fail(error, json_logs=settings.log_format == "json")


@app.command()
def validate(config: Path = typer.Argument(..., help="YAML config file")) -> None:
    """Check a config file without starting anything (Spark SQL expressions are compiled by Spark's parser)."""
    try:
        settings = load_settings(config)
        _compile_expressions(config, settings)
    except CdcLakehouseError as error:
        _fail(error)
    typer.echo(f"{config}: valid, {len(settings.pipelines)} pipeline(s), {len(settings.databases)} database(s), "
               f"{len(settings.joins)} join(s), {len(settings.exports)} export(s)")
    for line in _table_pipelines(settings) + _database_tables(settings):
        typer.echo(line)


def _compile_expressions(config: Path, settings) -> None:
    """`ConfigError` naming every pipeline (or database and table) and column whose Spark SQL expression does
    not compile; a database table's expressions are compiled whether its topic exists yet or not."""
    from service.kafka_to_delta.database.tables import declared, naming_tables
    from service.runtime.sql_parser import compile_problems

    problems = naming_tables(compile_problems(declared(settings)), settings)
    if problems:
        raise ConfigError(f"{config}: " + "; ".join(problems))


def _table_pipelines(settings) -> list[str]:
    """The plan summary of the database tables that run as pipelines of their own (their shape, history, state)."""
    if not any(o.own_query for d in settings.databases for o in d.tables.values()):
        return []
    from service.kafka_to_delta.database.tables import table_pipelines_only
    from service.kafka_to_delta.plan.compiled_plan import summary

    return summary(table_pipelines_only(settings))


def _database_tables(settings) -> list[str]:
    """Per database source: the tables its pattern matches on the cluster now (or why they are unknown)."""
    if not settings.databases:
        return []
    from service.operations.routes import matched_tables

    return matched_tables(settings)


@app.command(name="plan")
def plan_command(
    config: Path = typer.Argument(..., help="YAML config file"),
    output: Path = typer.Option(None, "--output", "-o", help="write the plan JSON here (default: stdout only)"),
) -> None:
    """Every stateful operator of every pipeline: its key, its state TTLs (plan JSON), and a summary."""
    import json

    from service.kafka_to_delta.database.tables import expanded
    from service.kafka_to_delta.plan.compiled_plan import compile_plan, summary

    try:
        settings = expanded(load_settings(config))  # a database table with state is a pipeline of its own
        _compile_expressions(config, settings)
    except CdcLakehouseError as error:
        _fail(error)
    document = json.dumps(compile_plan(settings), indent=2)
    if output is None:
        typer.echo(document)
    else:
        output.write_text(document + "\n")
        typer.echo(f"plan written to {output}")
    for line in summary(settings) + _database_tables(settings):
        typer.echo(line)


@app.command(name="rebuild-state")
def rebuild_state_command(
    config: Path = typer.Argument(..., help="YAML config file (the new one)"),
    pipeline: str = typer.Option(..., "--pipeline", help="the pipeline whose materializer state to rebuild"),
) -> None:
    """With the service stopped: a new checkpoint whose materializer state is seeded from the Delta table
    (the old checkpoint is moved aside); the pipeline then goes on from where the table's content ends."""
    from service.kafka_to_delta.plan.state_rebuild import rebuild_state, spark_state_reader

    try:
        from service.kafka_to_delta.database.tables import expanded

        settings = expanded(load_settings(config))  # a database table with state is a pipeline of its own
        report = rebuild_state(settings, pipeline, read_state=spark_state_reader(settings))
    except CdcLakehouseError as error:
        _fail(error)
    for line in report.lines():
        typer.echo(line)


@app.command()
def status(
    config: Path = typer.Argument(..., help="YAML config file"),
    as_json: bool = typer.Option(False, "--json", help="one JSON document instead of a table"),
) -> None:
    """Where each pipeline and export stands: checkpoint, lag, Delta version; for exports the published version."""
    import json

    from service.operations.status import ExportStatus, PipelineStatus
    from service.operations.status import status as read_status

    try:
        from service.kafka_to_delta.database.tables import expanded

        found = read_status(expanded(load_settings(config)))
    except CdcLakehouseError as error:
        _fail(error)
    if as_json:
        typer.echo(json.dumps([s.as_dict() for s in found], indent=2))
        return
    pipelines = [item for item in found if isinstance(item, PipelineStatus)]
    exports = [item for item in found if isinstance(item, ExportStatus)]
    typer.echo(f"{'pipeline':<20}{'lag':>10}{'checkpoint batch':>18}{'delta batch':>13}{'version':>9}  table")
    for item in pipelines:
        shown = _cells(item.checkpoint_batch, item.delta_batch, item.table_version)
        typer.echo(f"{item.name:<20}{item.lag:>10}{shown[0]:>18}{shown[1]:>13}{shown[2]:>9}  {item.table_uri}"
                   + (f"  [{item.quarantined}]" if item.quarantined else ""))
    if exports:
        typer.echo(f"\n{'export':<20}{'lag':>10}{'checkpoint batch':>18}{'published':>11}{'version':>9}  table -> topic")
        for export in exports:
            shown = _cells(export.checkpoint_batch, export.published_version, export.table_version)
            typer.echo(f"{export.name:<20}{export.lag:>10}{shown[0]:>18}{shown[1]:>11}{shown[2]:>9}  "
                       f"{export.table_uri} -> {export.topic}")


def _cells(*values: int | None) -> list[str]:
    return ["-" if value is None else str(value) for value in values]


@app.command()
def demo(
    output: Path = typer.Option(Path(".cdc-lakehouse/demo"), help="where the demo's tables and checkpoints go"),
    events: int = typer.Option(2000, min=1),
    keys: int = typer.Option(200, min=1),
) -> None:
    """Local broker + synthetic Debezium workload + pipeline, end to end."""
    from service.operations.demo import demo as run_demo

    _setup_logging(False)
    try:
        ok = run_demo(output, events, keys)
    except CdcLakehouseError as error:
        _fail(error)
    raise typer.Exit(0 if ok else 1)


@app.command()
def prepare() -> None:
    """Write the local Spark JVM's class archive (about 3 s off every later start; scripts/install.sh runs it)."""
    from service.runtime.jvm_class_archive import prepare as prepare_archive

    _setup_logging(False)
    path = prepare_archive()
    typer.echo(f"JVM class archive: {path}" if path is not None else "no JVM class archive (see the log above)")


def main() -> None:
    """Console script entry point."""
    app()


if __name__ == "__main__":
    main()
