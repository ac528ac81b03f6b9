"""``python -m service.deliver``: events POSTed to the endpoints of ``EXPIRY_WEBHOOKS``
(docs/webhooks.md): the process (``deliverer.py``) and one courier per endpoint
(``courier.py``)."""
