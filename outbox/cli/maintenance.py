"""`maintenance`: operator commands; each parses options, calls one operation, renders.

The app and its shared options live in `outbox.cli.operator`; the commands, by concern, in
`schema` (migrate, schema), `report` (outbox-report, outbox-failures, health), `repair`
(requeue, discard, replay, reconcile, audit), `rebuild` (projections-rebuild, in place or as
a version), `projectors` (pause, resume, promote, retire), `cleanup`
and `console` (the web console). Importing them
registers their commands.
"""

from __future__ import annotations

from typing import NoReturn

from outbox.cli.common import main as run_main
from outbox.cli.operator import app

# isort: off
# Importing a command module registers its commands; this order is their order in --help.
from outbox.cli import schema
from outbox.cli import report
from outbox.cli import health
from outbox.cli import repair
from outbox.cli import rebuild
from outbox.cli import projectors
from outbox.cli import cleanup
from outbox.cli import console

# isort: on

__all__ = ["app", "main"]

COMMANDS = (
    schema,
    report,
    health,
    repair,
    rebuild,
    projectors,
    cleanup,
    console,
)  # registered on `app` at import


def main(argv: list[str] | None = None, prog: str = "maintenance") -> NoReturn:
    run_main(app, prog, argv, help_without_args=True)
