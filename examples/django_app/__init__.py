"""A tiny Django project serving the example tools beside Django (see exampleproject/asgi.py)."""
