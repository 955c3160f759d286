"""The durable dispatcher: from "session S needs attention" to submitted tool results.

Steps 6-11 of "One delivery, end to end" (docs/how-it-works/architecture.md), cut by responsibility:

- :mod:`.scheduler`: :class:`Dispatcher`, the facade: the session queue, single-flight per
  session, the recovery sweep, worker completions;
- :mod:`.execution`: one call's life: concurrency slot, claim, run (handler, reconcile hook
  or worker hand-off), save, submit; the in-doubt policy;
- :mod:`.limits`: flow control's side of a call: its limit, and its wait for a turn of its
  tool's limiter, holding no slot;
- :mod:`.submission`: sending a saved result, and settling a refusal (stale);
- :mod:`.leases`: renewing a claim's lease while work on it runs, and fencing the holder
  that could not renew it;
- :mod:`.settling`: an operator's answer or re-run for a held or in-doubt call;
- :mod:`.approvals`: a person's decision on a call held for approval, and running it;
- :mod:`.alarms`: configuration problems (401/403) reported once per cause;
- :mod:`.settings`: :class:`DispatchSettings`.

The route of one delivery, from :meth:`AgentWebhookApp.__call__
<agentfn_asgi.app.AgentWebhookApp.__call__>` to the submitted result (each module is entered
once or twice)::

    app.AgentWebhookApp.__call__ → _webhook      read the body, verify (signing), parse (wire)
      store.record_delivery                       durable before the 2xx
      dispatch.scheduler.Dispatcher.schedule      queue the session (single-flight)
    [resolver task]
      dispatch.scheduler.Dispatcher.resolve       client.retrieve_session → required_actions
        → one task per pending call, then wait until every claim is decided,
          store.mark_delivery_resolved
    [call task]
      dispatch.execution.Executor.run             slot → store.claim_call
        → _obtain_result                          tools.parse_arguments, tools.invoke
                                                  (or reconcile / worker hand-off)
        → results.encode_result                   the event, its key, the size budget
        → store.save_result                       durable before submission
        → dispatch.submission.Submitter.submit    client.submit_raw_events,
                                                  store.mark_submitted (or stale)

Stream mode (:meth:`AgentWebhookApp.follow <agentfn_asgi.app.AgentWebhookApp.follow>`)
enters at ``store.record_delivery`` the same way; the recovery sweep enters at ``resolve``
(deliveries) and at ``Executor.resubmit`` (saved, unsubmitted results).

Each part logs under its own name: ``agentfn_asgi.dispatch.scheduler``, ``.execution``,
``.submission``, ``.leases`` and ``.alarms``.
"""

from __future__ import annotations

from agentfn_asgi.dispatch.scheduler import Dispatcher
from agentfn_asgi.dispatch.settings import DispatchSettings

__all__ = ["DispatchSettings", "Dispatcher"]
