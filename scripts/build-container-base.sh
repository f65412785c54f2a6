#!/usr/bin/env bash
# A Debian bookworm base image with python3.11 and its venv module, built by debootstrap from
# Debian's packages, for `podman build --build-arg BASE=localhost/gpuroute-base:bookworm .`
# where no image registry is reachable (tests/system/test_container.py; the Dockerfile's
# default base, python:3.11-slim-bookworm, comes from Docker Hub). Needs root, debootstrap
# and podman. The root file system is kept as a tarball under ~/.cache/gpuroute/container/,
# so after the first run (~3 min) it is only imported again (seconds) when podman's store
# lacks the image.
#   scripts/build-container-base.sh [TAG]     (default localhost/gpuroute-base:bookworm)
set -euo pipefail
tag=${1:-localhost/gpuroute-base:bookworm}
cache=${GPUROUTE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuroute}/container
tarball=$cache/debian-bookworm-python3.tar
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
podman=${PODMAN:-podman}
if $podman image exists "$tag"; then
    echo "build-container-base: $tag exists"
    exit 0
fi
if [ ! -s "$tarball" ]; then
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/root.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    echo "build-container-base: debootstrap bookworm from $mirror into $root (~3 min)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log"; exit 1; }
    # what an image does not need: apt's package lists and downloads, documentation
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar --numeric-owner -C "$root" -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
fi
$podman import --quiet --change 'CMD ["/bin/bash"]' "$tarball" "$tag" >/dev/null
echo "build-container-base: $tag imported from $tarball"
