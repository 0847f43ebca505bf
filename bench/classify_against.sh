#!/usr/bin/env bash
# Times this tree's classifier beside the one of a git ref, in the same process:
#   bench/classify_against.sh REF [classify|classify_runs] [case substring]
# REF is checked out into a temporary worktree; bench/classify_baseline.cpp is compiled
# against its headers (the namespace renamed) and linked into this tree's bench program
# built with -DMASKLENS_BASELINE. Release flags as Meson's --buildtype=release (-O3,
# NDEBUG); CXX picks the compiler (g++ by default). The program fails when a verdict differs.
set -euo pipefail
ref=${1:?usage: bench/classify_against.sh REF [classify|classify_runs] [case substring]}
program=${2:-classify}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach -q "$work/tree" "$ref"
cxx=${CXX:-g++}
flags=(-std=c++20 -O3 -DNDEBUG)
"$cxx" "${flags[@]}" -I"$work/tree/include" -I"$work/tree" -c "$root/bench/classify_baseline.cpp" -o "$work/baseline.o"
"$cxx" "${flags[@]}" -DMASKLENS_BASELINE -I"$root/include" -c "$root/bench/$program.cpp" -o "$work/$program.o"
"$cxx" "$work/$program.o" "$work/baseline.o" -o "$work/$program"
"$work/$program" "${@:3}"
