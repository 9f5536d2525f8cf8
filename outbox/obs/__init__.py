"""Observability: structured log lines (`log`) and Prometheus metrics (`metrics`).

It owns how the package reports what it does, never what it does: nothing here reads or
writes the queue, holds SQL, or decides anything about work rows. Every part of the package may
log; the worker service records and serves metrics, fed with figures the queue reads return.
"""
