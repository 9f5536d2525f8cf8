"""`outbox-worker`: run the apply (or shadow) worker for an app's projectors."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

from outbox.cli.common import DsnOption, UsageError
from outbox.cli.common import main as run_main

app = typer.Typer(
    name="outbox-worker",
    help="Claim due work rows and apply the app's projectors exactly once.",
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def worker(
    app_path: Annotated[
        str | None,
        typer.Option(
            "--app", envvar="OUTBOX_APP", help="module:attribute of the outbox.Outbox app."
        ),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Run the worker until SIGTERM/SIGINT."""
    raise UsageError("the apply worker is not available in this build yet")


def main() -> NoReturn:
    run_main(app, "outbox-worker")
