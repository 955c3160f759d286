"""The Redis store: the state table rendered as Lua (``compile``), the scripts (``scripts``),
the key layout and its versions (``layout``), the pipeline of one loop turn's scripts
(``batch``) and the store over them (``store``). Imported only when a ``redis://`` URL is
opened: its driver is an optional extra."""
