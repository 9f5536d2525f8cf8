"""The release this code is: the one place its version is written (the package metadata reads
it here, and the schema records it beside each function definition it applies)."""

__version__ = "0.2.0.dev0"
