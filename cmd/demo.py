#!/usr/bin/env python3
"""Thin entry script for `make demo`; the demo lives in outbox/examples/demo.py."""

from outbox.examples.demo import main

if __name__ == "__main__":
    main()
