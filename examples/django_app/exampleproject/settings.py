"""Minimal Django settings for the example (SQLite, one app, no admin or auth)."""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

# A development key: set DJANGO_SECRET_KEY in any real deployment.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = ["examples.django_app.orders"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "examples.django_app.exampleproject.urls"
TEMPLATES: list[dict[str, object]] = []

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DJANGO_DB", str(BASE_DIR / "db.sqlite3")),
        # Keep connections for a minute; ``django_db`` closes them when they grow old.
        "CONN_MAX_AGE": 60,
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
