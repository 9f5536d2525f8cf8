"""The work queue (`projection_apply_outbox`): every statement on the outbox table lives here.

It must never run projectors or decide policy beyond what a statement needs; the worker and
the maintenance operations call these functions inside their own transactions.
"""

from __future__ import annotations

__all__ = ["WORK_CHANNEL"]

# The LISTEN/NOTIFY channel appends signal; payload-free, one per append transaction.
WORK_CHANNEL = "outbox_work"
