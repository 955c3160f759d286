"""A randomized fault soak (issue 27): three replicas of the Starlette example as real uvicorn
processes, on one shared store, behind the package's fake Agents API served over loopback,
while a seeded nemesis kills, pauses and cuts them off and the fake misbehaves.

Run it with ``make soak`` or ``python -m tests.soak`` from the repository root::

    SOAK_STORE=redis SOAK_SECONDS=600 SOAK_SEED=1234 python -m tests.soak

- :mod:`.config`: the ``SOAK_*`` settings;
- :mod:`.workload`: the sessions (a steady rate of scripted turns of mixed calls);
- :mod:`.nemesis`: the seeded fault schedule and its execution;
- :mod:`.cluster`: the replicas (start, SIGKILL, SIGSTOP/SIGCONT, restart) and the cutting
  of their store connections (only theirs: the servers are shared);
- :mod:`.checker`: what must hold over everything recorded, and the one final line;
- :mod:`.run`: the run itself.

New kinds of turns (approval, flow control) are entries of ``workload.TURN_KINDS``; new
faults are entries of ``nemesis.FAULT_KINDS``.
"""
