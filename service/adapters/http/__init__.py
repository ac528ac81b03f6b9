"""HTTP: the server of a process's health and metrics endpoints (``server.py``)."""
