# One image for the server and the node probes.
#   docker build -t gputally .
#   docker run --rm -p 4317:4317 -p 4318:4318 gputally serve --config /etc/gputally/config.yaml
# Built in two stages: the build stage installs gputally and its dependencies into a virtual
# environment, the final stage copies only that environment, so it has no compiler, no pip
# and no wheel or build cache. It runs as uid 10001 and needs no writable path but /tmp, so
# it runs with a read-only root filesystem (as the Helm chart and manifests run it).
#
# BASE is any image with python3 (>= 3.11) and its venv module (ensurepip); both stages use
# it, so the environment's interpreter path is the same in both. tests/deploy/test_image.py
# builds on a Debian bookworm base made locally (tests/harness/image/build.sh), because
# Docker Hub cannot be reached where the tests run.
ARG BASE=python:3.12-slim

FROM ${BASE} AS build
# Only for a build behind a TLS-intercepting proxy: the CA bundle pip should trust, a path
# inside the build (tests/harness/image/build.sh bind-mounts the host's bundle over the base's
# /etc/ssl/certs/ca-certificates.crt for the build and passes that path). Empty: pip's own.
ARG PIP_CERT=""
WORKDIR /src
RUN python3 -m venv /opt/gputally
# The dependencies first, from pyproject.toml alone: a change to gputally's source rebuilds
# only the layers below, not this one.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' >requirements.txt \
 && /opt/gputally/bin/pip install --no-cache-dir --disable-pip-version-check -r requirements.txt
COPY README.md ./
COPY src ./src
COPY receiver ./receiver
COPY exporters ./exporters
COPY processors ./processors
COPY probes ./probes
COPY proto ./proto
# --no-deps: the dependencies are the layer above. pip compiles every module to bytecode, so
# nothing is written under /opt at run time. pip (and the setuptools a 3.11 venv
# brings) go last: nothing in the image runs them.
RUN /opt/gputally/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps . \
 && /opt/gputally/bin/gputally version \
 && /opt/gputally/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM ${BASE}
RUN groupadd --system --gid 10001 gputally \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gputally
COPY --from=build /opt/gputally /opt/gputally
# In a container the embedded default must listen beyond loopback to be reachable.
ENV PATH=/opt/gputally/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPUTALLY_GRPC_ENDPOINT=0.0.0.0:4317 \
    GPUTALLY_HTTP_ENDPOINT=0.0.0.0:4318 \
    GPUTALLY_ADMIN_ENDPOINT=0.0.0.0:8888
USER 10001:10001
EXPOSE 4317 4318 8888
ENTRYPOINT ["gputally"]
CMD ["serve"]
