"""The SQL stores (SQLite, PostgreSQL): the state table rendered as SQL (``compile``), the
schema and its versions (``schema``), the statements (``statements``), what the two
databases spell differently (``dialect``), the store over them (``store``), and each
database's connection code (``sqlite``, ``sqlite_writer``, ``postgres``, ``pg_pool``)."""
