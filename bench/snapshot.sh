#!/usr/bin/env bash
# A frozen copy of one commit to benchmark, unaffected by edits in the working tree (several people may work in it):
#
#   bench/snapshot.sh DIR [REV] [PATH=REV2]...
#
# DIR/src is `git archive REV` (default HEAD); each PATH=REV2 takes that file from REV2 instead (a "before" side).
# DIR/src/vmsched also gets gateway/ and services/ (the package as installed), so that
#   cd DIR/src && PYTHONPATH=$PWD CHECKOUT/.venv/bin/python bench/bench_decisions.py ...
# runs the snapshot's code in every process (CHECKOUT: this checkout; its editable install's finder comes after
# PYTHONPATH).
set -euo pipefail
dir="$1" rev="${2:-HEAD}"
shift $(( $# >= 2 ? 2 : 1 ))
rm -rf "$dir" && mkdir -p "$dir/src"
git archive "$rev" | tar -x -C "$dir/src"
for spec in "$@"; do
  git show "${spec#*=}:${spec%%=*}" > "$dir/src/${spec%%=*}"
done
cp -r "$dir/src/gateway" "$dir/src/vmsched/gateway"
cp -r "$dir/src/services" "$dir/src/vmsched/services"
echo "$dir: $(git rev-parse --short "$rev") $*"
