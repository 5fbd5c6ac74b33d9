"""`sparkpoint nexmark generate`: Nexmark's person, auction and bid streams as Parquet files,
the bounded input of the Nexmark example pipelines (docs/nexmark.md)."""

from __future__ import annotations

import time

import click


@click.group()
def nexmark() -> None:
    """Nexmark benchmark data."""


@nexmark.command()
@click.option("--events", type=click.IntRange(min=0), required=True,
              help="number of events over all three streams (1 person : 3 auctions : 46 bids)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="directory that receives person/, auction/ and bid/")
@click.option("--seed", type=int, default=0, show_default=True, help="same seed, same events")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=10_000.0, show_default=True,
              help="events per second of event time (nexmark's first-event.rate)")
@click.option("--files-per-stream", type=click.IntRange(min=1), default=1, show_default=True,
              help="Parquet files per stream; file k holds the k-th range of events")
def generate(events: int, out_dir: str, seed: int, rate: float, files_per_stream: int) -> None:
    """Write Nexmark events as Parquet to the person/, auction/ and bid/ directories under --out."""
    from sparkpoint.connectors.nexmark import NexmarkConfig, write_parquet

    started = time.perf_counter()
    try:
        rows = write_parquet(out_dir, events, NexmarkConfig(seed=seed, rate=rate), files_per_stream)
    except FileExistsError as e:
        raise click.ClickException(str(e)) from None
    took = time.perf_counter() - started
    click.echo(f"nexmark: {events} events in {took:.1f} s ({events / max(took, 1e-9):,.0f} events/s) to {out_dir}: "
               + ", ".join(f"{stream} {count}" for stream, count in rows.items()))


def register(cli: click.Group) -> None:
    cli.add_command(nexmark)
