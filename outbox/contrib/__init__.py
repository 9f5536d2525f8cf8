"""Helpers for frameworks (optional extras): `django` (`pip install outbox[django]`)."""
