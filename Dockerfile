# syntax=docker/dockerfile:1
# expiry-service: one image for every command (migrate, produce, consume, demo).
#   docker build -t expiry-service .
#   docker run --rm expiry-service python -m service.migrate
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtualenv with the dependencies, then the package ----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# Dependencies first, read from pyproject.toml alone: this layer is rebuilt
# only when pyproject.toml changes, not on every source edit.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && pip install --only-binary=:all: -r requirements.txt

# Then the package itself, without touching the dependencies again.
COPY README.md ./
COPY service ./service
RUN pip install --no-deps . \
 && pip uninstall --yes pip setuptools wheel

# ---- runtime: the virtualenv only; no compilers, no pip caches ------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="expiry-service" \
      org.opencontainers.image.description="Expires customer-support holds exactly once"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 expiry \
 && useradd --system --no-log-init --uid 10001 --gid expiry --no-create-home \
            --home-dir /app --shell /usr/sbin/nologin expiry
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
USER 10001:10001

# Healthy while a TCP connection opens to the database and to a broker node
# named by DATABASE_URL and AMQP_URL and, where the process serves its HTTP
# endpoint (EXPIRY_HTTP_PORT: the consumers), GET /readyz answers 200
# (see service/healthcheck.py).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["python", "-m", "service.healthcheck", "--timeout", "5"]

# SIGTERM (docker stop) makes a consumer stop taking deliveries, finish those
# it holds, and exit 0; allow EXPIRY_SHUTDOWN_TIMEOUT_SECONDS (30) for that.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "service.consume"]
