#!/usr/bin/env bash
# The CUDA suite and the three device benchmarks of this tree beside those of a base tree,
# in one session on one GPU: what a change that must not move any figure (a refactor) is
# held to.
#   bench/device_against.sh BASE [OUT]
# BASE is a git ref (checked out into a temporary worktree) or a directory holding a tree
# (for a machine with a copy of the sources but not their history: `git archive REF | tar
# -x -C DIR` where the history is). Both trees are built in release mode for GPU_ARCHS
# (default 90) into OUT/build-base and OUT/build-head (OUT default: bench-against); then
# each tree's `meson test --suite cuda`, and device_scan, device_step and device_tiles run
# base, head, base, head (warm-up runs of their own, medians inside each), one JSON line
# per case into OUT/<bench>-<tree>-<round>.jsonl; the summary prints each case's figure
# for base and head and their ratio, and the suites' test case and assertion counts.
# STEPS (default "build suites benches") names the parts to run: a session with a time
# limit per command runs "build suites", then "benches" (the builds kept in OUT).
set -uo pipefail
base=${1:?usage: bench/device_against.sh BASE [OUT]}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${2:-bench-against}" && cd "${2:-bench-against}" && pwd)
archs=${GPU_ARCHS:-90}
meson_bin=${MESON:-meson}

if [ -d "$base" ]; then
  base_src=$(cd "$base" && pwd)
else
  base_src=$out/base-tree
  rm -rf "$base_src"
  git -C "$root" worktree add --detach -q "$base_src" "$base" || exit 1
  trap 'git -C "$root" worktree remove --force "$base_src" >/dev/null 2>&1 || true' EXIT
fi

build() {  # build TREE NAME
  local dir=$out/build-$2
  [ -d "$dir" ] || "$meson_bin" setup "$dir" "$1" --buildtype=release -Dcuda=enabled -Dgpu_archs="$archs" \
    -Dpython=disabled -Dtests=enabled -Dbenchmarks=enabled -Dexamples=disabled -Dtools=disabled \
    > "$out/setup-$2.log" 2>&1 || { tail -20 "$out/setup-$2.log"; return 1; }
  ninja -C "$dir" > "$out/ninja-$2.log" 2>&1 || { tail -30 "$out/ninja-$2.log"; return 1; }
}
steps=" ${STEPS:-build suites benches} "
has() { [[ $steps == *" $1 "* ]]; }
if has build; then build "$base_src" base && build "$root" head || exit 1; fi

has suites && for tree in base head; do
  "$meson_bin" test -C "$out/build-$tree" --suite cuda --print-errorlogs > "$out/cuda-$tree.log" 2>&1
  echo "cuda suite, $tree: $(grep -E '^(Ok|Fail|Skipped):' "$out/cuda-$tree.log" | tr '\n' ' ')"
  grep -hE "test cases:|assertions:" "$out/build-$tree/meson-logs/testlog.txt" | sort | uniq -c | sed 's/^/    /'
done

has benches || exit 0
for round in 1 2; do
  for tree in base head; do
    for bench in device_scan device_step device_tiles; do
      "$out/build-$tree/bench/$bench" --json "$out/$bench-$tree-$round.jsonl" > "$out/$bench-$tree-$round.log" 2>&1 \
        || { echo "$bench ($tree, round $round) failed:"; tail -5 "$out/$bench-$tree-$round.log"; }
    done
  done
done

python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
# The figure each benchmark is judged on, per case: its own time.
FIGURE = {"device_scan": "scan_ms", "device_step": "step_ms", "device_tiles": "tiles_ms"}
for bench, key in FIGURE.items():
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, f"{bench}-*-*.jsonl"))):
        tree = os.path.basename(path).split("-")[-2]
        for line in open(path):
            case = json.loads(line)
            rows.setdefault(case["case"], {}).setdefault(tree, []).append(case[key])
    print(f"\n{bench} ({key}, the two rounds' medians; head / base)")
    for case, by in rows.items():
        b, h = by.get("base", []), by.get("head", [])
        if b and h:
            ratio = (sum(h) / len(h)) / (sum(b) / len(b))
            print(f"  {case:<48} base {' '.join(f'{x:.4f}' for x in b):<16} head {' '.join(f'{x:.4f}' for x in h):<16}"
                  f" {ratio:.3f}")
EOF
