#!/usr/bin/env bash
# libnccl.so.2 has SONAME libnccl.so.2 and exports every function that
# braid's nccl.h declares under its nccl and pnccl names,
# and nothing else. (That the header declares all of NVIDIA's is
# compare_headers.py's test.)
#   check_symbols.sh LIBRARY HEADER
set -euo pipefail
lib=$1 header=$2
soname=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libnccl.so.2 ] || { echo "SONAME is '$soname', not libnccl.so.2" >&2; exit 1; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TW]$/ {print $3}')
declared=$( (tr '\n' ' ' <"$header" | grep -o 'BRAID_NCCL_API([^,]*, *[A-Za-z0-9]*' |
  sed 's/.*, *//' | grep -v '^name$'
  sed -n 's/^nccl\([A-Za-z0-9]*\)(.*/\1/p' "$header") | sort -u)
[ "$(wc -l <<<"$declared")" -gt 60 ] || { echo "read only $(wc -l <<<"$declared") functions from $header" >&2; exit 1; }
missing=0
for f in $declared; do
  for name in "nccl$f" "pnccl$f"; do
    grep -qx "$name" <<<"$exported" || { echo "not exported: $name" >&2; missing=1; }
  done
done
others=$(grep -v '^p\?nccl' <<<"$exported" || true)
[ -z "$others" ] || { echo "exported besides the API: $others" >&2; missing=1; }
[ $missing = 0 ] && echo "symbols: the $(wc -l <<<"$declared") functions of $header under both names; $(wc -l <<<"$exported") exported, nothing else"
exit $missing
