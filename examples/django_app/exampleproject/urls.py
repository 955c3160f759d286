"""Django's own routes; the webhooks are routed beside Django in ``asgi.py``, not here."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path


def index(request: HttpRequest) -> JsonResponse:
    """A Django view, to show that Django keeps serving everything but the webhooks."""
    return JsonResponse({"app": "django example"})


urlpatterns = [path("", index)]
