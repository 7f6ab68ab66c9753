# The Vigil image: `vigil operator` (the chart's default command), `vigil-agent` and
# `kubectl-vigil`. Tagged as the chart's default image, localhost/vigil:<version>:
#   docker build -t localhost/vigil:0.2.0 . && kind load docker-image localhost/vigil:0.2.0 --name vigil
#   helm install vigil charts/vigil -n vigil-system --create-namespace
# `make dist` saves it as dist/vigil-image-<version>.oci.tar, the release's image (README, "Installing").
# testbed/kind/setup.sh does the first line for the kind path. `make image` (testbed/image.sh)
# builds it with podman instead, with no Docker engine and, if need be, no registry.
#
# The base is pinned by tag; for reproducible builds pin it by digest too, e.g.
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> .
# Any base with CPython >= 3.11 as python3 will do: testbed/image.sh uses Debian 12's own
# python3 (/usr/bin/python3, where the official image has /usr/local/bin) when no registry
# answers; the virtualenv at /opt/vigil hides the difference.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# Stage 1: a virtualenv with Vigil and its dependencies (pure-Python wheels or manylinux wheels;
# nothing is compiled). Its pip is removed before the copy, so the final stage installs nothing.
FROM ${PYTHON_IMAGE} AS build
# WHEELS: a directory inside the build holding every wheel needed (the build's requirements
# too), to install from instead of the package index; empty: the index. testbed/image.sh mounts
# one at /wheels (`podman build --volume`), since its builds have no network.
ARG WHEELS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python3 -m venv /opt/vigil
COPY pyproject.toml README.md ./
COPY operator ./operator
# Byte-compiled here, because the running container's root filesystem is read-only.
RUN /opt/vigil/bin/pip install ${WHEELS:+--no-index --find-links "$WHEELS"} --compile . \
 && /opt/vigil/bin/pip uninstall --yes pip

# Stage 2: the base image, the virtualenv, a fixed non-root user; no compiler, no pip run.
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vigil" \
      org.opencontainers.image.description="Kubernetes-native job scheduler: operator and heartbeat agent" \
      org.opencontainers.image.source="https://github.com/vigil-dev/vigil" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/vigil/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/vigil /opt/vigil
# 65532 matches the chart's runAsUser; numeric so runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
ENTRYPOINT ["vigil"]
CMD ["operator"]
