"""Command lines: typer apps that parse options and render results, nothing else.

The operations themselves live in the core modules and return plain data; these apps never
hold SQL or business rules.
"""
