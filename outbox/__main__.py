"""`python -m outbox`: both command-line tools behind one entry, for environments without the
installed scripts on PATH.

    python -m outbox worker --app myapp.projections:app      # = outbox-worker ...
    python -m outbox maintenance outbox-report --json        # = maintenance ...
    python -m outbox --version
"""

from __future__ import annotations

import sys
from typing import NoReturn

from outbox import __version__

USAGE = """usage: python -m outbox worker [OPTIONS]        (outbox-worker)
       python -m outbox maintenance COMMAND ...  (maintenance)
       python -m outbox --version"""


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    tool, rest = (args[0], args[1:]) if args else ("", [])
    if tool == "worker":
        from outbox.cli.worker import main as worker

        worker(rest, prog="python -m outbox worker")
    if tool == "maintenance":
        from outbox.cli.maintenance import main as maintenance

        maintenance(rest, prog="python -m outbox maintenance")
    if tool == "--version":
        print(f"outbox {__version__}")
        raise SystemExit(0)
    if tool in ("-h", "--help"):
        print(USAGE)
        raise SystemExit(0)
    shown = f"unknown tool {tool!r}" if tool else "no tool given"
    print(
        f"python -m outbox: error: {shown}; expected worker or maintenance (see -h)",
        file=sys.stderr,
    )
    raise SystemExit(2)


if __name__ == "__main__":
    main()
