"""A one-model Django app: orders the ``lookup_order`` tool reads through the ORM."""
