# gpuroute's Python services in one image: `router`, `agent`, `global` (and `fake-engine`).
#   docker build -t gpuroute .
#   docker run -p 8080:8080 -v $PWD/router.toml:/etc/gpuroute/router.toml gpuroute \
#       router --config /etc/gpuroute/router.toml
# The agent needs the host's NVIDIA devices for NVML: run it with `--gpus all` (or on the
# host with deploy/systemd/gpuroute-agent.service).
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY gpuroute gpuroute
COPY router router
COPY agent agent
COPY global global
COPY sim sim
COPY fleet fleet
COPY testbed testbed
COPY bench bench
COPY demo demo
# gpuroute's own wheel only: its dependencies come from the hash-locked requirements.lock
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --home /nonexistent --shell /usr/sbin/nologin gpuroute
COPY requirements.lock /tmp/requirements.lock
RUN pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock && rm /tmp/requirements.lock
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels
USER gpuroute
EXPOSE 8080 9090 7070 7071
ENV PYTHONUNBUFFERED=1
# The router's liveness; load balancers should use /readyz on the admin listener instead.
HEALTHCHECK --interval=10s --timeout=2s --retries=3 \
    CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=1)" || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["gpuroute"]
CMD ["--help"]
