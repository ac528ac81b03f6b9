"""``python -m service.console``: the operator console, in a browser.

What is stuck, why, and what happens if I replay it: the overview (the oldest
due hold against the objective, the backlog, parked holds, queues and
consumers, open dead letters by class, the scanners' last passes), dead
letters by group and page by page, one dead letter whole (its record, the
hold's audit trail, its replays, who owns it and what was said), and the acts
(assign, note, close, reopen, replay with a dry run first), each audited.

Modules: ``auth`` (passwords, CSRF tokens), ``sessions`` (sessions kept in
PostgreSQL, throttled and audited logins), ``guard`` (what every request meets
and every answer carries), ``protocol`` (414 and 431 from the HTTP server),
``web`` (what every page is made with), ``app`` (the application and the pages
that read), ``acts`` (assign, note, close, reopen, replay), ``login`` (logging
in and out, the sessions page), ``pages`` (what the pages read), and the
templates.
"""
