"""Create the orders table and seed the order the examples refund (``ord_1``)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models


def seed(apps: Any, schema_editor: Any) -> None:
    order = apps.get_model("orders", "Order")
    order.objects.create(order_id="ord_1", customer_id="123", total_cents=4200)


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []

    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("order_id", models.CharField(max_length=64, unique=True)),
                ("customer_id", models.CharField(max_length=64)),
                ("total_cents", models.IntegerField()),
            ],
        ),
        migrations.RunPython(seed, migrations.RunPython.noop),
    ]
