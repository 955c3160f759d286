"""A call: its model and its machine, what the stores and the dispatcher share.

- :mod:`agentfn_asgi.calls.records`: the values (``CallKey``, ``CallRecord``,
  ``SavedResult``, ``ApprovalRequest``, ``Limit``...), importing nothing of the package;
- :mod:`agentfn_asgi.calls.states`: the state machine declared once, each transition with its
  guards and its effects, ``apply()`` (the reference every store is held to), in doubt, the
  history bound and the claim's order.
"""
