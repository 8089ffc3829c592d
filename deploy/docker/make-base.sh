#!/bin/sh
# Make the base images of deploy/docker/*Dockerfile locally, from Debian packages, where no
# image registry is reachable (scripts/test_ops.sh). Needs docker, apt-get, dpkg-deb,
# debootstrap and python3 with pip; takes about a minute; an image that exists is kept.
#
#   rlark-base-cc:bookworm      what distroless/cc-debian12 holds for rlark: glibc and
#                               libgcc_s (extracted from the libc6, libgcc-s1 and gcc-12-base
#                               packages), CA certificates, passwd/group with root and nonroot
#                               (65532), /tmp; no shell, no package manager
#   rlark-base-python:bookworm  Debian bookworm (debootstrap --variant=minbase) with python3,
#                               and numpy, grpcio and protobuf for `rlark up --demo` (wheels
#                               from PyPI installed into /usr/local/lib/python3.11/dist-packages)
#
# The Debian mirror is the one apt uses here (/etc/apt/sources.list.d, sources.list).
set -eu

mirror() {
    { cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } |
        awk '/^URIs:/ { print $2; exit }' | grep . ||
        awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! docker image inspect rlark-base-cc:bookworm >/dev/null 2>&1; then
    echo "make-base: rlark-base-cc:bookworm from libc6, libgcc-s1, gcc-12-base"
    root=$work/cc
    mkdir -p "$root" "$work/debs"
    # Package lists older than the mirror name versions it no longer has: update once then.
    (cd "$work/debs" && { apt-get download libc6 libgcc-s1 gcc-12-base >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get download libc6 libgcc-s1 gcc-12-base >/dev/null; }; })
    for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
    # Only what a program linked against glibc needs at run time.
    rm -rf "$root/usr/share/doc" "$root/usr/share/lintian" "$root/usr/share/man" "$root/usr/share/locale" \
        "$root/usr/lib/x86_64-linux-gnu/gconv" "$root/usr/bin" "$root/usr/sbin" "$root/sbin" "$root/bin" \
        "$root/usr/libexec"
    mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot" "$root/var/lib"
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
    printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
    chmod 1777 "$root/tmp"
    chown 65532:65532 "$root/home/nonroot"
    tar -C "$root" --numeric-owner -c . | docker import - rlark-base-cc:bookworm >/dev/null
fi

if ! docker image inspect rlark-base-python:bookworm >/dev/null 2>&1; then
    echo "make-base: rlark-base-python:bookworm (debootstrap minbase + python3, numpy, grpcio, protobuf)"
    root=$work/python
    debootstrap --variant=minbase --include=python3 bookworm "$root" "$(mirror)" >"$work/debootstrap.log" 2>&1 ||
        { cat "$work/debootstrap.log" >&2; exit 1; }
    # The image's python3 is 3.11: wheels for CPython 3.11 on manylinux x86_64.
    python3 -m pip install -q --disable-pip-version-check --no-compile \
        --target "$root/usr/local/lib/python3.11/dist-packages" \
        --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        'numpy' 'grpcio>=1.85.1' 'protobuf>=7.35.1,<8'
    rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/* "$root/usr/share/doc" "$root/usr/share/man"
    tar -C "$root" --numeric-owner -c . | docker import - rlark-base-python:bookworm >/dev/null
fi
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^rlark-base-'
