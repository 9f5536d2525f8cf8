"""Drive the site's view with Django's test client and print what each request answered."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import django
import orjson

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")
django.setup()

from django.test import Client  # noqa: E402 - after setup, as Django requires

from django_site.views import Refused  # noqa: E402


def main() -> None:
    client = Client()
    answers: dict[str, object] = {}
    answers["committed"] = client.post("/orders/o-1").json()
    for name, query in (
        ("rolled_back", "fail=1"),
        ("first_then_rolled_back", "append_first=1&fail=1"),
    ):
        try:
            client.post(f"/orders/{name}?{query}")
        except Refused:
            answers[name] = "refused"
    answers["keyed"] = client.post("/orders/o-2?key=req-9").json()
    answers["retried"] = client.post("/orders/o-2?key=req-9").json()  # the same request again
    # docs/append.md's Django example, as written.
    docs = (Path(__file__).resolve().parents[2] / "docs" / "append.md").read_text()
    example = re.search(r"^```python example=django\n(.*?)^```$", docs, re.M | re.S)
    assert example is not None
    namespace: dict[str, object] = {}
    exec(example.group(1), namespace)  # noqa: S102 - the docs' own example
    place_order = namespace["place_order"]
    assert callable(place_order)
    answers["docs"] = place_order("o-docs").last_seq
    answers["docs_retried"] = place_order("o-docs").duplicate  # the same request again
    sys.stdout.write(orjson.dumps(answers).decode() + "\n")


if __name__ == "__main__":
    main()
