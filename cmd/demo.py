#!/usr/bin/env python3
"""Thin entry script for `make demo`; the demo lives in docs/examples/campaigns_demo/demo.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "examples"))

from campaigns_demo.demo import main

if __name__ == "__main__":
    main()
