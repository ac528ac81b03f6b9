"""expiry-service: expires customer-support holds exactly once."""

from service import pid1

pid1.install()
