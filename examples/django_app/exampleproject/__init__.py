"""The Django project: settings, URLs, the ASGI entry point and the tools it serves."""
