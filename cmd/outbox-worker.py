#!/usr/bin/env python3
"""Thin entry script: `outbox-worker` from a source checkout (the installed script is the same)."""

from outbox._entry import worker

if __name__ == "__main__":
    worker()
