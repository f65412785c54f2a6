# gpuroute's Python services in one image; the first argument picks the tier (its ports):
#   router       the OpenAI API on 8080; admin (/metrics, /admin/*, /readyz) on 9090
#   global       the global tier's API on 8090; its admin on 9091
#   agent        the load stream (gRPC) on 7070; admin (/status, /metrics, drain) on 7071
#   fake-engine  a simulated GPU engine (vLLM's API) on 8000, to try the others with
# /etc/gpuroute/ holds container-ready configs (deploy/container/): listeners on 0.0.0.0,
# tokens read from /run/secrets/ (docs/deploy.md, "Container image"). A router in front of
# an engine named `engine`:
#   docker build -t gpuroute .
#   docker network create gpuroute
#   docker run -d --network gpuroute --name engine gpuroute fake-engine --host 0.0.0.0
#   openssl rand -hex 32 > admin-token && chmod 600 admin-token && sudo chown 10001 admin-token
#   docker run -d --network gpuroute -p 8080:8080 -p 9090:9090 \
#       -v $PWD/admin-token:/run/secrets/admin-token:ro gpuroute \
#       router --config /etc/gpuroute/router.toml
#   openssl rand -hex 24 > api-key      # the router's API wants a known key: add one
#   gpuroute admin keys add --admin-url http://localhost:9090 --token-file admin-token \
#       --key-file api-key --tenant me
#   curl -H "Authorization: Bearer $(cat api-key)" http://localhost:8080/v1/models
# The healthcheck (gpuroute-healthcheck) finds the tier running in the container and probes
# that tier's own port from its config. The agent needs the host's NVIDIA devices for NVML:
# run it with `--gpus all` (or on the host with deploy/systemd/gpuroute-agent.service).
# BASE: any Debian bookworm image with python3.11 and its venv module. The default is the
# public python image; tests/system/test_container.py builds one with debootstrap instead
# (`--build-arg BASE=localhost/gpuroute-base:bookworm`), since it can reach no registry.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

# the dependencies, from the hash-locked requirements.lock (a layer that stays cached until
# the lock changes), in a virtual environment both stages have at the same path
FROM ${BASE} AS deps
RUN python3 -m venv /opt/gpuroute
COPY requirements.lock /tmp/requirements.lock
RUN /opt/gpuroute/bin/pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock

# gpuroute's own wheel
FROM deps AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuroute gpuroute
COPY router router
COPY agent agent
COPY global global
COPY sim sim
COPY planner planner
COPY fleet fleet
COPY testbed testbed
COPY bench bench
COPY demo demo
RUN /opt/gpuroute/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE}
RUN useradd --system --uid 10001 --home /nonexistent --shell /usr/sbin/nologin gpuroute
COPY --from=deps /opt/gpuroute /opt/gpuroute
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/gpuroute/bin/pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels
COPY deploy/container/healthcheck.py /usr/local/bin/gpuroute-healthcheck
COPY deploy/container/router.toml deploy/container/global.toml deploy/container/agent.toml \
    /etc/gpuroute/
ENV PATH=/opt/gpuroute/bin:$PATH PYTHONUNBUFFERED=1
USER gpuroute
EXPOSE 8080 9090 8090 9091 7070 7071 8000
# Each tier's liveness on its own port (router 8080, global 8090, agent's admin 7071,
# fake-engine 8000, or what its config says); load balancers use /readyz instead.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["gpuroute-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["gpuroute"]
CMD ["--help"]
