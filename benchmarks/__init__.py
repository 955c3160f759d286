"""Reproducible benchmarks: agentfn-asgi against the hand-written inline webhook handler.

Run ``make bench`` (or ``python -m benchmarks.run --quick``); see ``benchmarks/README.md``.
"""
