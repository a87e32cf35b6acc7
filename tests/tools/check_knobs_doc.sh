#!/usr/bin/env bash
# docs/knobs.md is generated from the knob table (src/core/knobs.cc): it must
# equal what `braid-info --config --markdown` prints now.
#   check_knobs_doc.sh BINDIR SOURCEDIR
set -uo pipefail
bin=$1
src=$2
if ! diff -u "$src/docs/knobs.md" <("$bin/braid-info" --config --markdown); then
  echo "docs/knobs.md differs from the knob table (- the file, + the table); regenerate it:" >&2
  echo "  build/bin/braid-info --config --markdown > docs/knobs.md" >&2
  exit 1
fi
echo "docs/knobs.md matches the knob table"
