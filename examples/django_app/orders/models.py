"""One model, enough to show a tool handler using the ORM."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """An order a customer placed."""

    order_id = models.CharField(max_length=64, unique=True)
    customer_id = models.CharField(max_length=64)
    total_cents = models.IntegerField()

    def __str__(self) -> str:
        return str(self.order_id)
