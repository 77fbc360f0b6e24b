# One image for the server and the node probes.
#   docker build -t gputally .
#   docker run --rm -p 4317:4317 -p 4318:4318 gputally serve --config /etc/gputally/config.yaml
# Built in two stages so the final image has no compiler and no build cache; runs as non-root.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY receiver ./receiver
COPY exporters ./exporters
COPY processors ./processors
COPY probes ./probes
COPY proto ./proto
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12-slim
RUN useradd --system --uid 10001 --no-create-home gputally
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# In a container the embedded default must listen beyond loopback to be reachable.
ENV GPUTALLY_GRPC_ENDPOINT=0.0.0.0:4317 \
    GPUTALLY_HTTP_ENDPOINT=0.0.0.0:4318 \
    GPUTALLY_ADMIN_ENDPOINT=0.0.0.0:8888
USER 10001
EXPOSE 4317 4318 8888
ENTRYPOINT ["gputally"]
CMD ["serve"]
