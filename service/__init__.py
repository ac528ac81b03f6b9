"""expiry-service: expires customer-support holds exactly once."""

from service import early, pid1

pid1.install()
early.check_otel_environment()
