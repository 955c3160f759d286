"""The demo's process helpers (:mod:`agentfn_asgi.demo.process`)."""

from __future__ import annotations

import socket

import pytest

from agentfn_asgi.demo import process
from agentfn_asgi.demo.process import free_port


def test_free_port_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Picked one after the other, before either is bound, two ports differ even when the
    OS offers the same one again (it may, once the first probe is closed): forced here,
    since the OS does it only by chance."""
    offered = iter([50_001, 50_001, 50_001, 50_002])
    monkeypatch.setattr(process, "_probe", lambda host: next(offered))
    monkeypatch.setattr(process, "_HANDED_OUT", set())
    assert [free_port(), free_port()] == [50_001, 50_002]


def test_free_port_is_free() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
