"""expiry-service: expires customer-support holds exactly once."""

from service.adapters import pid1

pid1.install()
