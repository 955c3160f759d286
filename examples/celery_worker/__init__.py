"""A tool run by Celery workers: the Starlette example plus a Celery app on RabbitMQ."""
