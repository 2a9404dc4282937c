"""Command line: `cdc-lakehouse run | validate | status | demo`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from service.errors import CdcLakehouseError
from service.settings import load_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(error: CdcLakehouseError) -> None:
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(1)


@app.command()
def run(
    config: Path = typer.Argument(..., help="YAML config file"),
    until_idle: bool = typer.Option(False, "--until-idle", help="process what is available now, then exit 0"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the configured pipelines until SIGTERM/SIGINT (or until idle)."""
    from service.runner import run as run_service

    _setup_logging(verbose)
    try:
        run_service(load_settings(config), until_idle=until_idle)
    except CdcLakehouseError as error:
        _fail(error)


@app.command()
def validate(config: Path = typer.Argument(..., help="YAML config file")) -> None:
    """Check a config file without starting anything."""
    try:
        settings = load_settings(config)
    except CdcLakehouseError as error:
        _fail(error)
    typer.echo(f"{config}: valid, {len(settings.pipelines)} pipeline(s)")


@app.command()
def status(
    config: Path = typer.Argument(..., help="YAML config file"),
    as_json: bool = typer.Option(False, "--json", help="one JSON document instead of a table"),
) -> None:
    """Where each pipeline stands: checkpoint batch and offsets, lag, Delta version and batch."""
    import json

    from service.status import status as read_status

    try:
        found = read_status(load_settings(config))
    except CdcLakehouseError as error:
        _fail(error)
    if as_json:
        typer.echo(json.dumps([s.as_dict() for s in found], indent=2))
        return
    typer.echo(f"{'pipeline':<20}{'lag':>10}{'checkpoint batch':>18}{'delta batch':>13}{'version':>9}  table")
    for item in found:
        cells = [item.checkpoint_batch, item.delta_batch, item.table_version]
        shown = ["-" if c is None else str(c) for c in cells]
        typer.echo(f"{item.name:<20}{item.lag:>10}{shown[0]:>18}{shown[1]:>13}{shown[2]:>9}  {item.table_uri}")


@app.command()
def demo(
    output: Path = typer.Option(Path(".cdc-lakehouse/demo"), help="where the demo's tables and checkpoints go"),
    events: int = typer.Option(2000, min=1),
    keys: int = typer.Option(200, min=1),
) -> None:
    """Local broker + synthetic Debezium workload + pipeline, end to end."""
    from service.demo import demo as run_demo

    _setup_logging(False)
    try:
        ok = run_demo(output, events, keys)
    except CdcLakehouseError as error:
        _fail(error)
    raise typer.Exit(0 if ok else 1)


def main() -> None:
    """Console script entry point."""
    app()


if __name__ == "__main__":
    main()
