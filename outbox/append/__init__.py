"""The write path: validate an append (`validate`) and write it to the journal (`journal`).

It owns the journal, the campaign heads and the append idempotency keys. It knows nothing of
projectors or workers: inline apply, which runs projectors inside the append's transaction,
belongs to `outbox.projection`.
"""
