"""``python -m bench``: the throughput and lag benchmark of the expiry service (issue 6).

It runs against the local PostgreSQL and RabbitMQ, in a database and a vhost of
its own (removed afterwards), and drives the real commands as subprocesses:
``service.migrate``, ``service.produce --scan`` / ``--every`` and
``service.consume``. In the same run it measures the raw limits the service is
compared with (publish with confirms and consume + ack with no database work,
the batched guarded update with no broker) and prints the figures, their
ratios and whether each target of the issue is met.
"""
