"""Settings of the minimal site: one PostgreSQL database from OUTBOX_DJANGO_DSN, one view."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

_url = urlsplit(os.environ["OUTBOX_DJANGO_DSN"])

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}
SECRET_KEY = "outbox-tests-only"
ROOT_URLCONF = "django_site.urls"
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS: list[str] = []
USE_TZ = True
