"""``python -m service.demo``: from nothing to watching holds expire, with one command.

Where PostgreSQL and RabbitMQ already run, the demo creates its own database
(``CREATE DATABASE`` on the server of ``DATABASE_URL``) and its own vhost
(through the management API: ``EXPIRY_MANAGEMENT_URL``, or
``RABBITMQ_MANAGEMENT_URL``, or beside ``AMQP_URL``), so it never touches
anyone's data (``workspace.py``). In them it runs the real
commands: ``service.migrate``, then declares the topology as
``service.declare`` does (the deploy's step), then several ``service.consume``
and ``service.produce --every``. It places a few thousand holds due over the
next few seconds, and a support side consumes some of them right at their
deadline, racing the service with the same guarded update other systems use.
It shows live progress, stops everything with SIGTERM, prints a summary that
checks that every hold ended in exactly one state, and removes what it created
(``--keep`` leaves it for inspection). Exit 0 only if every check passed.

Modules: ``plan`` (the command line), ``sandbox`` (the sandbox and the
settings inside it), ``children`` (the real commands as subprocesses),
``support`` (the holds and the support side), ``watch`` (live progress),
``summary`` (the final state and its checks), ``run`` (the steps in order).
"""
