# loopwarden: the stream-processor image (`loopwarden worker` by default).
#
#   docker build -t loopwarden .
#   docker run --rm -e LOOPWARDEN_BROKER=kafka:9092 -p 6066:6066 loopwarden            # a worker
#   docker run --rm -e LOOPWARDEN_BROKER=kafka:9092 loopwarden simulate --runs 50      # any other command
#
# Every dependency of the [processor] extra ships as a manylinux wheel, so the
# slim image needs no compiler. The build stage keeps pip and the sources out of
# the final image.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# pyproject.toml names README.md as the package's readme: setuptools needs it to build.
COPY pyproject.toml README.md ./
COPY loopwarden/ loopwarden/
RUN python -m venv /opt/loopwarden \
 && /opt/loopwarden/bin/pip install '.[processor]'

FROM python:3.11-slim
# In a container the HTTP server must listen beyond loopback to be reachable at
# all (the port is only exposed where a deployment publishes it). Kubernetes
# sets LOOPWARDEN_CANONICAL_URL to each pod's DNS name: see k8s/statefulset.yaml.
ENV PATH=/opt/loopwarden/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LOOPWARDEN_WEB_HOST=0.0.0.0 \
    LOOPWARDEN_DATA_DIR=/data
# A fixed uid/gid (10001) so Kubernetes can check runAsNonRoot and set fsGroup.
RUN groupadd --system --gid 10001 loopwarden \
 && useradd --system --uid 10001 --gid loopwarden --home-dir /data --no-create-home \
            --shell /usr/sbin/nologin loopwarden \
 && mkdir -p /data \
 && chown loopwarden:loopwarden /data
COPY --from=build /opt/loopwarden /opt/loopwarden
USER 10001:10001
WORKDIR /data
# /healthz, /readyz, /metrics, /runs
EXPOSE 6066
ENTRYPOINT ["loopwarden"]
CMD ["worker"]
