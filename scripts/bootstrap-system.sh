#!/usr/bin/env bash
# System packages the benchmarks and their smoke tests use: HAProxy and NGINX (baselines),
# wrk (overhead benchmark), redis-server (shared state between router replicas), openssl (the
# certificates of the TLS tests, the secure demo and bench overhead --tls). Installs what is
# missing when apt-get and root are available;
# otherwise says what to install and carries on (the tests that need them then skip).
set -u
need=()
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need+=(redis-server)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null \
        || echo "bootstrap: could not install ${need[*]}; benchmark smoke tests will skip"
else
    echo "bootstrap: missing ${need[*]} (install them to run the baselines); continuing"
fi
exit 0
