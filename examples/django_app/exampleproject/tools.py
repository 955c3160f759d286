"""The tools the Django example serves: the shared ones plus one that uses the ORM.

Import this only after ``django.setup()`` (``asgi.py`` does that): it imports models.
"""

from __future__ import annotations

from typing import Any

from agentfn_asgi import FunctionTools
from agentfn_asgi.demo.tools import build_tools
from agentfn_asgi.integrations.django import django_db
from examples.django_app.orders.models import Order

tools = FunctionTools()
tools.include(build_tools())


@tools.function
@django_db
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by ID.

    Args:
        order_id: The order's ID, e.g. ``ord_1``.
    """
    # A synchronous handler runs in a worker thread, where the ORM is safe to use;
    # ``django_db`` handles the thread's connection as Django does around a request.
    order = Order.objects.filter(order_id=order_id).first()
    if order is None:
        return {"found": False, "order": None}
    return {
        "found": True,
        "order": {
            "order_id": order.order_id,
            "customer_id": order.customer_id,
            "total_cents": order.total_cents,
        },
    }
