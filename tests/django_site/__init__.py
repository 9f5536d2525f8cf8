"""A minimal Django site for the Django append test (test_django.py runs it in a subprocess)."""
