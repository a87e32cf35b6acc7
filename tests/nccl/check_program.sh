#!/usr/bin/env bash
# Runs the NCCL-only test program at N ranks, after checking that it loads
# libnccl.so.2 from braid's build.  check_program.sh PROGRAM LIBDIR N
set -euo pipefail
program=$1 libdir=$2 ranks=$3
loaded=$(ldd "$program" | awk '$1 == "libnccl.so.2" {print $3}')
[ "$(readlink -f "$loaded")" = "$(readlink -f "$libdir/libnccl.so.2")" ] ||
  { echo "the program loads libnccl.so.2 from '$loaded', not $libdir" >&2; exit 1; }
exec "$program" "$ranks"
