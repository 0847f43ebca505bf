#!/usr/bin/env bash
# What including masklens costs a framework's translation unit: g++ -fsyntax-only time
# (median of 5) of a file that includes only the given header, beside the baseline a
# C++ file pays anyway (<vector>, <string>, <algorithm>).
#   bench/parse_cost.sh [HEADER...]   default: the umbrella, decide.hpp, inspect.hpp, policy.hpp
# CXX picks the compiler (default g++); the flags are -std=c++20 -fsyntax-only only.
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-g++}
[ $# -gt 0 ] || set -- masklens/masklens.hpp masklens/decide.hpp masklens/inspect.hpp masklens/policy.hpp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# median_parse FILE: the median of 5 wall-clock seconds of $cxx -fsyntax-only FILE.
median_parse() {
  local i start end
  for i in 1 2 3 4 5; do
    start=$(date +%s.%N)
    "$cxx" -std=c++20 -fsyntax-only -Iinclude "$1"
    end=$(date +%s.%N)
    awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f\n", e - s }'
  done | sort -n | sed -n 3p
}

printf '#include <vector>\n#include <string>\n#include <algorithm>\n' >"$work/baseline.cpp"
echo "$("$cxx" --version | head -1); $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-40s %s s\n' "<vector> <string> <algorithm> (baseline)" "$(median_parse "$work/baseline.cpp")"
for header in "$@"; do
  printf '#include <%s>\n' "$header" >"$work/header.cpp"
  printf '%-40s %s s\n' "<$header>" "$(median_parse "$work/header.cpp")"
done
