# doq server image: `doq serve`, configured by DOQ_* variables (docs/reference.md).
# Build from the repository root:  docker build -t doq:0.1.0 .
# Only the server's dependencies are installed (`pip install .`, no extras), at the versions
# pinned in constraints.txt; the runtime image has no pip or setuptools (neither in the venv
# nor in the base python). It runs as an unprivileged user and needs no writable path but
# its data directory (and /tmp).

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/doq
WORKDIR /src
COPY . .
RUN /opt/doq/bin/pip install --no-cache-dir -c constraints.txt . \
    && /opt/doq/bin/pip uninstall -q -y pip setuptools \
    && /opt/doq/bin/python -m compileall -q /opt/doq

FROM python:3.11-slim
RUN python -m pip uninstall -q -y pip setuptools wheel 2>/dev/null; \
    rm -rf /usr/local/bin/pip* /usr/local/lib/python3.11/ensurepip; \
    groupadd --system --gid 10001 doq \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/doq --no-create-home doq \
    && mkdir -p /var/lib/doq && chown 10001:10001 /var/lib/doq
COPY --from=build /opt/doq /opt/doq
ENV PATH=/opt/doq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DOQ_DATA_DIR=/var/lib/doq \
    DOQ_GRPC_ADDR=0.0.0.0:10000 \
    DOQ_HTTP_ADDR=0.0.0.0:8000 \
    DOQ_RAFT_ADDR=0.0.0.0:9000
WORKDIR /var/lib/doq
VOLUME /var/lib/doq
EXPOSE 10000 8000 9000
USER 10001:10001
ENTRYPOINT ["doq"]
CMD ["serve"]
