"""Durable stores: the protocol and ``open_store(url)``."""
