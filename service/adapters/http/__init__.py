"""HTTP: the server of a process's health and metrics endpoints (``server.py``), and the
client that delivers events to webhook endpoints (``endpoints.py``)."""
