# expiry-service: one image for every command (migrate, declare, produce, consume,
# relay, retention, console, deadletters, status, verify, demo).
#   docker build -t expiry-service \
#     --build-arg VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])') \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run --rm expiry-service python -m service.migrate
#
# The same bytes on every build: the base image by digest, every Python package
# from the lock (requirements/*.txt, exported from uv.lock) with its hash.
# python:3.11-slim-bookworm, the multi-platform index (linux/amd64, linux/arm64);
# update it with: docker buildx imagetools inspect python:3.11-slim-bookworm
# A release is built on this base. Where it can't be pulled (no registry), another
# base with python3.11, venv and useradd may be given as --build-arg PYTHON_IMAGE=...
# (CI builds on one made from Debian's packages: docs/deployment.md, "The image").
# No "# syntax=" line: the builder's own Dockerfile frontend (BuildKit) handles
# RUN --mount, and none has to be pulled.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:b18992999dbe963a45a8a4da40ac2b1975be1a776d939d098c647482bcad5cba

# ---- build: a virtualenv with the dependencies, then the package ----------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# Dependencies first, from the lock alone: this layer is rebuilt only when the
# lock changes, not on every source edit. Wheels only, each checked against its
# hash; pip's cache survives between builds (BuildKit cache mount). Behind a
# TLS-intercepting proxy, give its CA as the build secret "ca" and
# --build-arg PIP_CERT=/run/secrets/ca: mounted for this step only, never in a layer.
COPY requirements/runtime.txt requirements/build.txt ./requirements/
ARG PIP_CERT
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca,required=false \
    pip install --require-hashes --only-binary=:all: \
        -r requirements/runtime.txt -r requirements/build.txt

# Then the package itself, built with the locked setuptools, dependencies untouched.
COPY pyproject.toml README.md ./
COPY service ./service
RUN pip install --no-deps --no-build-isolation --no-cache-dir . \
 && pip uninstall --yes pip setuptools

# ---- runtime: the virtualenv only; no compilers, no pip caches ------------
FROM ${PYTHON_IMAGE} AS runtime
ARG PYTHON_IMAGE
ARG VERSION=0.0.0+unknown
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="expiry-service" \
      org.opencontainers.image.description="Expires customer-support holds exactly once" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
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
