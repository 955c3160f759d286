"""Runnable example apps (Starlette, FastAPI, Django) serving the same tools."""
