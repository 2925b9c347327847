# syntax=docker/dockerfile:1
#
# vmsched container images.
#
#   docker build -t vmsched:0.1.0 .                        # services (default target)
#   docker build -t vmsched-agent:0.1.0 --target agent .   # policy agent (+ libvirt-python)
#
# One image runs every service: the command picks it (`vmsched gateway`,
# `vmsched discovery`, `vmsched scoring`, `vmsched balancer`, `vmsched run`).
# The images install vmsched's wheel, built in the `wheel` stage, not the
# source tree. Python dependencies are pinned by constraints.txt; the base
# image by its full version tag (override PYTHON_IMAGE with a `@sha256:`
# digest to pin harder).

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- base: the runtime every stage shares --------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/vmsched/bin:$PATH \
    VMSCHED_HOST=0.0.0.0
# tini reaps the plugin worker processes and forwards signals.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 vmsched \
    && useradd --system --uid 10001 --gid vmsched --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin vmsched
WORKDIR /opt/vmsched

# --- wheel: vmsched's wheel, built from the sources -------------------------
FROM base AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY vmsched ./vmsched
COPY gateway ./gateway
COPY services ./services
COPY plugins ./plugins
RUN python -m pip wheel --no-deps --wheel-dir /dist .

# --- build: a virtualenv with the pinned dependencies and that wheel -------
FROM base AS build
WORKDIR /src
RUN python -m venv /opt/vmsched
COPY constraints.txt pyproject.toml ./
# Dependencies first (cached while pyproject.toml and constraints.txt hold still).
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && /opt/vmsched/bin/pip install -c constraints.txt -r /tmp/requirements.txt
COPY --from=wheel /dist /dist
RUN /opt/vmsched/bin/pip install -c constraints.txt /dist/vmsched-*.whl \
    && /opt/vmsched/bin/vmsched --help >/dev/null

# --- build-agent: adds libvirt-python (compiled against libvirt-dev) ------
FROM build AS build-agent
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libvirt-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
RUN /opt/vmsched/bin/pip install -c constraints.txt libvirt-python \
    && /opt/vmsched/bin/python -c "import libvirt"

# --- agent: the policy agent image (libvirt client library at run time) ---
FROM base AS agent
RUN apt-get update \
    && apt-get install -y --no-install-recommends libvirt0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-agent /opt/vmsched /opt/vmsched
LABEL org.opencontainers.image.title="vmsched-agent" \
      org.opencontainers.image.description="vmsched libvirt CPU policy agent" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "vmsched"]
CMD ["agent", "--help"]

# --- service: gateway, discovery, scoring, balancer (default target) ------
FROM base AS service
COPY --from=build /opt/vmsched /opt/vmsched
LABEL org.opencontainers.image.title="vmsched" \
      org.opencontainers.image.description="vmsched oVirt external scheduler: gateway and services" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 10001:10001
EXPOSE 18781 9100
ENTRYPOINT ["/usr/bin/tini", "--", "vmsched"]
CMD ["run"]
