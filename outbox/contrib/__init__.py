"""Helpers for frameworks (optional extras): `django` (`pip install pg-outbox[django]`)."""
