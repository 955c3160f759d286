"""A tools module that fails when imported (a missing setting), for tests/mistakes.py."""

from __future__ import annotations

import os

from agentfn_asgi import FunctionTools

SHOP_API_URL = os.environ["SHOP_API_URL_FOR_A_TEST"]
tools = FunctionTools()
