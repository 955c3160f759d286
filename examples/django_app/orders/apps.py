"""App config: a short label so tables are named ``orders_*``."""

from __future__ import annotations

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    """The orders app."""

    name = "examples.django_app.orders"
    label = "orders"
    default_auto_field = "django.db.models.BigAutoField"
