"""Projections: the `Outbox` app and `@app.projector` (`app`), the registrations (`registry`),
exactly-once dispatch (`dispatch`) under checkpoints and processed markers (`guards`), inline
apply (`inline`) and rebuilds from the journal (`rebuild`).

It applies events to read models, on a connection and inside a transaction someone else
opened (a worker's batch, an append, a replay, a rebuild). It never claims work or decides
what a failure costs: the worker claims, the failure policy (`outbox.retry`) decides.
"""
