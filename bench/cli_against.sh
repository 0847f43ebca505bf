#!/usr/bin/env bash
# The masklens command's output over a grid of calls, this tree's beside a git ref's:
#   bench/cli_against.sh REF [OUT_DIR]
# REF is checked out into a temporary worktree; both trees' `masklens` are built (Meson,
# the command alone: no Python, CUDA, tests or benchmarks) and run on the same sample
# masks (`masklens samples`, written by this tree's command) with every combination of
# dtype, training, GPU arch, head dim and installed families below, text and JSON. Each
# output is kept under OUT_DIR (a temporary directory by default) as base/ and head/, and
# `diff -ru` of the two is printed: nothing where the bytes are the same. Exit status 0
# when they are, 1 when they differ. MESON picks the meson binary (meson by default).
set -euo pipefail
ref=${1:?usage: bench/cli_against.sh REF [OUT_DIR]}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
out=${2:-$work/out}
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach -q "$work/tree" "$ref"
meson=${MESON:-meson}
build() {  # tree dir -> its masklens command
  "$meson" setup "$2" "$1" --buildtype=release -Dpython=disabled -Dcuda=disabled -Dtests=disabled \
    -Dbenchmarks=disabled -Dexamples=disabled -Dtools=enabled >/dev/null
  ninja -C "$2" tools/masklens >/dev/null
}
build "$work/tree" "$work/build-base"
build "$root" "$work/build-head"
samples=$work/samples
"$work/build-head/tools/masklens" samples "$samples" >/dev/null
mkdir -p "$out/base" "$out/head"
for side in base head; do
  cli=$work/build-$side/tools/masklens
  for dtype in bf16 fp16 fp32; do
    for training in "" --training; do
      for sm in 80 90 100; do
        for head_dim in 64 256; do
          for available in torch torch,flex torch,flash_attn,flash_attn3,flex,xformers,te,flashinfer,cudnn_frontend; do
            name=$dtype${training:+-training}-sm$sm-d$head_dim-${available//,/+}
            args=(--dtype "$dtype" $training --sm "$sm" --head-dim "$head_dim" --available "$available")
            for mask in "$samples"/*.npy; do
              m=$(basename "$mask" .npy)
              "$cli" inspect "$mask" "${args[@]}" > "$out/$side/$name.$m.txt" 2>&1 || true
              "$cli" inspect "$mask" --json "${args[@]}" > "$out/$side/$name.$m.json" 2>&1 || true
            done
          done
        done
      done
    done
  done
done
echo "$(ls "$out/head" | wc -l) outputs a side in $out"
if diff -ru "$out/base" "$out/head"; then
  echo "the command's bytes are the same over the grid"
else
  exit 1
fi
