#!/usr/bin/env bash
# examples/elastic as a user runs it: rank 2 of 4 is killed, the others go
# on at 3 ranks within a second of the kill, a replacement joins, training
# ends at 4 ranks with every worker done, and the plot is drawn.
#   check_elastic_train.sh BINDIR
set -euo pipefail
bin=$1
out_dir=$(mktemp -d)
trap 'rm -rf "$out_dir"' EXIT
out=$("$bin/elastic_train" --steps 900 --kill-at 1.0 --join-after 1.0 --out "$out_dir")
echo "$out"
after=$(sed -n 's/.*shrunk to 3 ranks, \([0-9.]*\) s after the kill.*/\1/p' <<<"$out")
[ -n "$after" ] || { echo "no shrink to 3 ranks" >&2; exit 1; }
awk -v s="$after" 'BEGIN {exit !(s < 1.0)}' || { echo "went on $after s after the kill" >&2; exit 1; }
grep -q "grew to 4 ranks" <<<"$out" || { echo "the replacement did not join" >&2; exit 1; }
grep -q "step  900  4 ranks" <<<"$out" || { echo "training did not end at 4 ranks" >&2; exit 1; }
grep -q "every worker finished" <<<"$out" || exit 1
grep -q "<polyline" "$out_dir/loss.svg" || { echo "no plot" >&2; exit 1; }
