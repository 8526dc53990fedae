#!/bin/sh
# Builds Katran's balancer from its source (default defines: IPIP, ring 65537), the XDP_TX
# floor and the runner into target/katran of this tree.
#   KATRAN_SRC=/path/to/katran xtask/katran/build.sh
# Needs clang-22, gcc and libbpf-dev (Debian). Katran is not vendored: give its checkout.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$(cd "$here/../.." && pwd)/target/katran
src=${KATRAN_SRC:?set KATRAN_SRC to a checkout of facebookincubator/katran (measured: 19f08fec)}
[ -f "$src/katran/lib/bpf/balancer.bpf.c" ] || { echo "no katran/lib/bpf/balancer.bpf.c under $src" >&2; exit 1; }
mkdir -p "$out/inc/gnu"
# glibc's headers ask for the 32-bit stubs under -target bpf; amd64 has none.
: > "$out/inc/gnu/stubs-32.h"
sys=/usr/include/$(gcc -dumpmachine)
clang-22 -O2 -g -target bpf -I "$src" -I "$src/katran/lib/linux_includes" -I "$out/inc" -I "$sys" \
    -Wno-unused-value -Wno-pointer-sign -Wno-compare-distinct-pointer-types \
    -c "$src/katran/lib/bpf/balancer.bpf.c" -o "$out/balancer.bpf.o"
clang-22 -O2 -g -target bpf -I "$sys" -c "$here/floor.bpf.c" -o "$out/floor.bpf.o"
gcc -O2 -Wall -I "$src" -o "$out/runner" "$here/runner.c" -lbpf
echo "built: $out/balancer.bpf.o $out/floor.bpf.o $out/runner"
