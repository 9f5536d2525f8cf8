"""The web console: what the queue holds, live, for a person in a browser.

`create_app(pool)` is an ASGI app (Starlette, server-rendered with Jinja2, htmx vendored in
`static/`: nothing is fetched from a CDN) that an application mounts; `serve(settings)` serves
it on an address of its own (what `maintenance console` runs). It is read-only unless built
with actions. Every page has a JSON twin under `/api/`. Figures come from
one shared poller (`overview.Poller`): at most one read per refresh interval however many pages
are open, each count bounded, every read in a read-only transaction under a statement timeout.
Needs the `console` extra: `pip install 'pg-outbox[console]'`.
"""

from __future__ import annotations

from outbox.console.app import create_app
from outbox.console.serve import serve

__all__ = ["create_app", "serve"]
