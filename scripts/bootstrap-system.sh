#!/usr/bin/env bash
# System packages the benchmarks and their smoke tests use: HAProxy and NGINX (baselines),
# wrk (overhead benchmark), redis-server (shared state between router replicas; the same
# binary runs the Sentinel tests' sentinels with `--sentinel`, so Debian's redis-sentinel package,
# only a service unit around it, is not needed), openssl (the
# certificates of the TLS tests, the secure demo and bench overhead --tls), prometheus and
# promtool (tests/system/test_observability.py: deploy/observability's rules and dashboard
# against a real Prometheus), chromium (tests/security/test_admin_browser.py: a web page
# in a real headless browser against the admin listeners), podman, buildah, runc and debootstrap
# (tests/system/test_container.py: the Dockerfile built on a Debian base made by debootstrap,
# each tier run in it; runc where crun cannot run containers). Installs what is
# missing when apt-get and root are available;
# otherwise says what to install and carries on (the tests that need them then fail under
# `make test`, and skip under a plain pytest).
set -u
need=()
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need+=(redis-server)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
if [ ${#need[@]} -eq 0 ]; then
    echo "bootstrap: haproxy, nginx, wrk, redis-server, openssl, prometheus, chromium, podman, buildah, runc and debootstrap are installed"
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${need[*]} with apt-get (first run only, ~1 min)"
    export DEBIAN_FRONTEND=noninteractive
    # dpkg's per-package lines go to /dev/null; errors (stderr) still show
    if apt-get update -qq >/dev/null && apt-get install -y -qq "${need[@]}" >/dev/null; then
        echo "bootstrap: installed ${need[*]}"
    else
        echo "bootstrap: could not install ${need[*]}; the tests that need them will fail"
    fi
else
    echo "bootstrap: missing ${need[*]}: install them (the tests that need them fail under make test)"
fi
exit 0
