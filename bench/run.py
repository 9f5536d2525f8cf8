#!/usr/bin/env python3
"""`make bench`: run every benchmark script in bench/ and let each print its figures (the
profiling tool `profile_drain.py` is run by hand, under py-spy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Tools, not benchmarks: they print no figure against a baseline (the soak is `make soak`).
TOOLS = {"run.py", "profile_drain.py", "soak.py"}

if __name__ == "__main__":
    failed = 0
    for script in sorted(HERE.glob("*.py")):
        if script.name in TOOLS or script.name.startswith("_"):
            continue
        print(f"== {script.name}", flush=True)
        failed |= subprocess.run(
            [sys.executable, str(script), *sys.argv[1:]], check=False
        ).returncode
    sys.exit(1 if failed else 0)
