#!/usr/bin/env bash
# Regenerates the pictures in docs/structures.md with the masklens CLI.
set -euo pipefail
M=${1:-./build/tools/masklens}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$M make causal --shape 1,1,128,128 -o "$tmp/causal.npy"
$M make sliding_window --shape 1,1,128,128 --window 32 -o "$tmp/sliding_window.npy"
$M make chunked --shape 1,1,128,128 --chunk 32 -o "$tmp/chunked.npy"
$M make prefix_lm --shape 1,1,128,128 --prefix 40 -o "$tmp/prefix_lm.npy"
$M make causal_blocks --shape 1,1,128,128 --blocks '[[20,44],[80,100]]' -o "$tmp/causal_blocks.npy"
$M make causal --shape 1,1,128,128 --segments '[[0,30,90,128]]' -o "$tmp/packed.npy"
$M make causal --shape 1,1,128,128 --kv-valid '[[24,128]]' -o "$tmp/left_padded.npy"
$M make causal --shape 1,1,32,128 --alignment bottom_right -o "$tmp/bottom_right.npy"
for f in "$tmp"/*.npy; do "$M" inspect "$f" --png "$here/$(basename "$f" .npy).png" >/dev/null; done
