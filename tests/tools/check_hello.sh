#!/usr/bin/env bash
# examples/hello_allreduce as the README runs it: under braid-run at 4 ranks
# every rank prints "rank R of 4: sum 10, expected 10: ok", once per rank.
#   check_hello.sh BINDIR
set -euo pipefail
bin=$1
out=$("$bin/braid-run" -n 4 "$bin/hello_allreduce")
echo "$out"
for r in 0 1 2 3; do
  [ "$(grep -cx "rank $r of 4: sum 10, expected 10: ok" <<<"$out")" = 1 ] ||
    { echo "rank $r did not print its line once with the sum 10" >&2; exit 1; }
done
