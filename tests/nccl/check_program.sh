#!/usr/bin/env bash
# Runs an NCCL-only test program with its arguments (N ranks, ...), after
# checking that it loads libnccl.so.2 from braid's build.
#   check_program.sh PROGRAM LIBDIR ARGS...
set -euo pipefail
program=$1 libdir=$2
shift 2
loaded=$(ldd "$program" | awk '$1 == "libnccl.so.2" {print $3}')
[ "$(readlink -f "$loaded")" = "$(readlink -f "$libdir/libnccl.so.2")" ] ||
  { echo "the program loads libnccl.so.2 from '$loaded', not $libdir" >&2; exit 1; }
exec "$program" "$@"
