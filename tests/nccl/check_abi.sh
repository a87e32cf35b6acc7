#!/usr/bin/env bash
# Runs the ABI printers built against braid's nccl.h and NCCL's own and
# fails on any difference.  check_abi.sh REFERENCE OTHER...
set -euo pipefail
reference=$1
shift
"$reference" >/tmp/braid-abi.$$.ref
status=0
for other in "$@"; do
  if ! "$other" | diff -u /tmp/braid-abi.$$.ref - ; then
    echo "ABI differs: $reference vs $other" >&2
    status=1
  fi
done
rm -f /tmp/braid-abi.$$.ref
echo "abi: $(wc -l <<<"$("$reference")") facts compared across $(( $# + 1 )) builds"
exit $status
