"""A tool run by a separate worker process: the Starlette example plus a Redis job queue."""
