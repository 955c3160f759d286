"""A randomized fault soak (issue 27): three replicas of the Starlette example as real uvicorn
processes, on one shared store, behind the package's fake Agents API served over loopback,
while a seeded nemesis kills, pauses and cuts them off and the fake misbehaves.

Run it with ``make soak`` or ``python -m tests.soak`` from the repository root::

    SOAK_STORE=redis SOAK_SECONDS=600 SOAK_SEED=1234 python -m tests.soak

- :mod:`.config`: the ``SOAK_*`` settings;
- :mod:`.workload`: the sessions (a steady rate of scripted turns of mixed calls);
- :mod:`.nemesis`: the seeded fault schedule and its execution;
- :mod:`.approver`: the person at the terminal, deciding approval requests with the CLI;
- :mod:`.cluster`: the replicas (start, SIGKILL, SIGSTOP/SIGCONT, restart) and the cutting
  of their store connections (only theirs: the servers are shared);
- :mod:`.checker`: what must hold over everything recorded, and the one final line;
- :mod:`.run`: the run itself.

The run's folder (``SOAK_DIR``, else a temporary one, printed) keeps what a post-mortem
needs: each replica's log per start (``replicaN-M.log``), the example ledger, the fault
schedule (``schedule.txt``), the faults as applied (``faults.txt``), the SQLite store, and
for every call still waited for after the drain its store record, history, requests and
webhooks (``waiting.txt``).

New kinds of turns are entries of ``workload.TURN_KINDS``; new faults are entries of
``nemesis.FAULT_KINDS``.
"""
