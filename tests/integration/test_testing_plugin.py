"""`outbox.testing` as an application uses it: pytest run on docs/examples/test_fastapi_app.py
(a migrated database per test, drain_now, assert_queue_empty), against this suite's server."""

from __future__ import annotations

import os
import sys

import anyio

from helpers import ROOT


async def test_the_documented_fastapi_tests_pass_with_the_plugin(pg_server: str) -> None:
    examples = ROOT / "docs" / "examples"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    environ |= {"OUTBOX_TEST_DSN": pg_server, "PYTHONPATH": str(examples)}
    with anyio.fail_after(170):
        proc = await anyio.run_process(
            [
                sys.executable,
                *("-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull),
                *("--rootdir", str(examples), "-o", "asyncio_mode=auto"),
                str(examples / "test_fastapi_app.py"),
            ],
            cwd=examples,
            env=environ,
            check=False,
        )
    output = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, output
    assert "2 passed" in output
