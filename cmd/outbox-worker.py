#!/usr/bin/env python3
"""Thin entry script: `outbox-worker` from a source checkout (the installed script is the same)."""

from outbox.cli.worker import main

if __name__ == "__main__":
    main()
