#!/usr/bin/env bash
# examples/ddp_mlp as a user runs it: at 2 and 3 ranks the loss after 40
# steps is under a quarter of the first step's.  check_ddp_mlp.sh BINDIR
set -euo pipefail
bin=$1
for ranks in 2 3; do
  out=$("$bin/braid-run" -n "$ranks" "$bin/ddp_mlp" --steps 40)
  first=$(awk '$1 == "step" && $2 == 1 {print $4}' <<<"$out")
  last=$(awk '$1 == "step" {v = $4} END {print v}' <<<"$out")
  echo "ddp_mlp at $ranks ranks: loss $first -> $last"
  awk -v a="$first" -v b="$last" 'BEGIN {exit !(a > 0 && b < a / 4)}' ||
    { echo "the loss did not fall enough" >&2; echo "$out" >&2; exit 1; }
done
