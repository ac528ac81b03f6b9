"""Operations an operator runs: dead letters (list, show, replay), status, verification.

Shared by the command line (``service.deadletters``, ``service.status``,
``service.verify``) and, later, a web console: each takes what it needs
already opened (a database connection, a broker connection) and returns
values and lines of text; the commands open, print and choose the exit code.
"""
