#!/usr/bin/env python3
"""Thin entry script: `maintenance` from a source checkout (the installed script is the same)."""

from outbox._entry import maintenance

if __name__ == "__main__":
    maintenance()
