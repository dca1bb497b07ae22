#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/fetch-debs.sh - bring what tests/gpu/run.sh needs to a GPU machine
# that has no package registry.
#
# Usage: tests/gpu/fetch-debs.sh      (on a Debian 12 development machine)
#
# Downloads (apt-get download: no install) the .deb files of the libraries
# loaderd builds against, with their -dev parts, pkg-config and protoc-c, into
# tests/gpu/debs/ (ignored by git), and puts protoc-c's output for
# proto/loader.proto beside them, for a machine where the downloaded protoc-c
# does not run. Debian 12's glibc (2.36) is older than the GPU image's, so the
# binaries run there. Then carry tests/gpu/debs with the device tool
# (carry: ["tests/gpu/debs"]) and run tests/gpu/run.sh there (docs/gpu.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out="$root/tests/gpu/debs"

pkgs=(
	libuv1 libuv1-dev
	libnng1 libnng-dev libmbedtls14 libmbedx509-1 libmbedcrypto7
	libprotobuf-c1 libprotobuf-c-dev protobuf-c-compiler libprotoc32 libprotobuf32
	libjansson4 libjansson-dev
	zlib1g-dev
	libturbojpeg0 libturbojpeg0-dev libjpeg62-turbo libjpeg62-turbo-dev
	libpng16-16 libpng-dev
	pkgconf pkgconf-bin libpkgconf3
)

mkdir -p "$out"
rm -f "$out"/*.deb
if ! (cd "$out" && apt-get download "${pkgs[@]}"); then
	echo "fetch-debs: apt-get download failed; run 'apt-get update' first" >&2
	exit 1
fi

mkdir -p "$out/proto"
protoc-c --proto_path="$root/proto" --c_out="$out/proto" "$root/proto/loader.proto"

du -sh "$out"
ls "$out"
