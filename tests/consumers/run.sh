#!/usr/bin/env bash
# Takes masklens in each way docs/consuming.md shows, as another project would, and
# builds and runs examples/quickstart.cpp each time (it prints
# "causal top_left -> torch.sdpa.cudnn" and exits 0 only when the verdict and the
# decision are right):
#   install  `meson install --destdir` from a fresh build with everything optional off:
#            the headers, the device scanner's sources (datadir/masklens/src),
#            datadir/pkgconfig/masklens.pc and datadir/cmake/masklens/, nothing
#            arch-dependent
#   cmake    find_package(masklens CONFIG) against that tree; a version it does not
#            satisfy is refused
#   cmake-absolute-dirs  the same with includedir and datadir absolute, outside the prefix
#   pkgconfig  pkg-config --cflags --libs masklens against that tree (no -std in them)
#   meson-subproject  dependency('masklens') falling back to subprojects/masklens (a copy
#            of this source tree): the consumer's build, tests and install hold nothing
#            of masklens until asked (-Dmasklens:install=enabled, :examples=enabled)
# Prints one line per check and ends with "N passed, N failed"; exit 1 on any failure.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
expected="causal top_left -> torch.sdpa.cudnn"
passed=0; failed=0

# check NAME COMMAND...: runs COMMAND with its output in $work/NAME.log.
check() {
  local name=$1; shift
  if "$@" >"$work/$name.log" 2>&1; then
    echo "consumer $name: ok"; passed=$((passed + 1))
  else
    echo "consumer $name: FAILED"; tail -40 "$work/$name.log"; failed=$((failed + 1))
  fi
}
fail() { echo "$*"; return 1; }
runs_quickstart() {
  local out
  out=$("$1") || fail "$1 exited $?: $out" || return 1
  [ "$out" = "$expected" ] || fail "$1 printed '$out', expected '$expected'"
}

dest=$work/dest
prefix=/usr/local
install_tree() {
  meson setup "$work/build" "$src" --prefix="$prefix" -Dtests=disabled -Dtools=disabled -Dexamples=disabled \
    -Dbenchmarks=disabled -Dcuda=disabled -Dpython=disabled || return 1
  meson install -C "$work/build" --destdir "$dest" || return 1
  local root=$dest$prefix f
  for f in include/masklens/masklens.hpp include/masklens/cuda/scan.hpp share/masklens/src/scan.cu \
           share/masklens/src/scan_none.cpp share/masklens/src/runs.cu share/masklens/src/runs_none.cpp \
           share/masklens/src/tiles.cu share/masklens/src/tiles_none.cpp share/masklens/src/without_cuda.hpp \
           share/pkgconfig/masklens.pc \
           share/cmake/masklens/masklensConfig.cmake share/cmake/masklens/masklensConfigVersion.cmake; do
    [ -f "$root/$f" ] || fail "not installed: $f" || return 1
  done
  # Header-only: nothing may land in an arch-dependent directory.
  [ ! -e "$root/lib" ] || fail "installed under lib/: $(find "$root/lib")"
}
check install install_tree

cmake_consumer() {
  cp "$src/tests/consumers/cmake/CMakeLists.txt" "$src/examples/quickstart.cpp" "$work/cmake-src/" || return 1
  cmake -S "$work/cmake-src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$dest$prefix" || return 1
  cmake --build "$work/cmake-build" --verbose || return 1
  runs_quickstart "$work/cmake-build/quickstart" || return 1
  # The version file answers: a 0.1.x install does not satisfy find_package(masklens 0.2).
  if cmake -S "$work/cmake-src" -B "$work/cmake-build-v" -DCMAKE_PREFIX_PATH="$dest$prefix" \
       -DMASKLENS_VERSION=0.2 >"$work/cmake-version.log" 2>&1; then
    fail "find_package(masklens 0.2) accepted version 0.1 (masklensConfigVersion.cmake)"
  fi
  grep -q 'compatible with requested version' "$work/cmake-version.log" \
    || fail "find_package(masklens 0.2) failed for another reason: $(tail -5 "$work/cmake-version.log")"
}
mkdir -p "$work/cmake-src"
check cmake cmake_consumer

# includedir and datadir given as absolute paths outside the prefix (as some distributions
# lay a package out): installed for real (a --destdir tree could not hold absolute paths),
# found through masklens_DIR, built and run; the CUDA sources where the variables say.
absolute_dirs_consumer() {
  local a=$work/absolute
  meson setup "$a/build" "$src" --prefix="$a/prefix" --includedir="$a/headers" --datadir="$a/data" \
    -Dtests=disabled -Dtools=disabled -Dexamples=disabled -Dbenchmarks=disabled -Dcuda=disabled \
    -Dpython=disabled || return 1
  meson install -C "$a/build" || return 1
  mkdir -p "$a/cmake-src" && cp "$src/tests/consumers/cmake/CMakeLists.txt" "$src/examples/quickstart.cpp" \
    "$a/cmake-src/" || return 1
  cmake -S "$a/cmake-src" -B "$a/cmake-build" -Dmasklens_DIR="$a/data/cmake/masklens" || return 1
  cmake --build "$a/cmake-build" --verbose || return 1
  runs_quickstart "$a/cmake-build/quickstart" || return 1
  grep -q "$a/headers" "$a/cmake-build/CMakeFiles/quickstart.dir/flags.make" \
    || fail "the include path is not the absolute includedir" || return 1
}
check cmake-absolute-dirs absolute_dirs_consumer

pkgconfig_consumer() {
  local flags
  # --define-variable relocates the file's prefix to where --destdir put the tree.
  flags=$(PKG_CONFIG_PATH="$dest$prefix/share/pkgconfig" pkg-config --define-variable=prefix="$dest$prefix" \
    --cflags --libs masklens) || return 1
  echo "pkg-config: $flags"
  case " $flags " in *" -std="*) fail "the .pc file forces a language standard: $flags"; return 1;; esac
  ${CXX:-c++} -std=c++20 "$src/examples/quickstart.cpp" -o "$work/pc-quickstart" $flags || return 1
  runs_quickstart "$work/pc-quickstart" || return 1
  # The device scanner's sources where the variables say; the stubs compile from there.
  local var file
  for var in cuda_source cuda_stub_source cuda_runs_source cuda_runs_stub_source cuda_tiles_source \
             cuda_tiles_stub_source; do
    file=$(PKG_CONFIG_PATH="$dest$prefix/share/pkgconfig" pkg-config --define-variable=prefix="$dest$prefix" \
      --variable="$var" masklens) || return 1
    [ -f "$file" ] || fail "pkg-config --variable=$var names $file, which is not installed" || return 1
    case "$var" in
      *stub*) ${CXX:-c++} -std=c++20 -c "$file" -o "$work/$var.o" $flags || return 1;;
    esac
  done
}
check pkgconfig pkgconfig_consumer

meson_subproject() {
  local c=$work/meson-consumer b=$work/meson-consumer/build tests installed
  mkdir -p "$c/subprojects/masklens" || return 1
  cp "$src/tests/consumers/meson/meson.build" "$src/examples/quickstart.cpp" "$c/" || return 1
  # The source tree as it is (committed or not), without build directories.
  if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$src" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -C "$c/subprojects/masklens" -xf - \
      || return 1
  else
    tar -C "$src" --exclude='./build*' -cf - . | tar -C "$c/subprojects/masklens" -xf - || return 1
  fi
  # force-fallback: the subproject even where a masklens.pc is installed system-wide.
  meson setup "$b" "$c" --force-fallback-for=masklens || return 1
  meson compile -C "$b" || return 1
  runs_quickstart "$b/quickstart" || return 1
  # The library alone: nothing of masklens compiled, tested or installed.
  built=$(find "$b/subprojects/masklens" -name '*.o' -o -name '*.a' -o -name '*.so')
  [ -z "$built" ] || fail "the subproject built: $built" || return 1
  tests=$(meson test -C "$b" --list --no-rebuild 2>/dev/null | tr '\n' ' ')
  echo "tests: $tests"
  case "$tests" in *masklens:*) fail "the subproject adds tests: $tests"; return 1;; esac
  case "$tests" in *consumer-quickstart*) ;; *) fail "the consumer's test is not listed: $tests"; return 1;; esac
  installed=$(meson introspect "$b" --installed)
  echo "installed: $installed"
  case "$installed" in *masklens*) fail "the subproject installs: $installed"; return 1;; esac
  # Asked for, it installs and adds its tests.
  meson setup --reconfigure "$b" "$c" -Dmasklens:install=enabled -Dmasklens:examples=enabled || return 1
  installed=$(meson introspect "$b" --installed)
  echo "installed when asked: $installed"
  case "$installed" in *include/masklens*) ;; *) fail "-Dmasklens:install=enabled installs no headers"; return 1;; esac
  case "$installed" in *share/pkgconfig/masklens.pc*) ;; *) fail "-Dmasklens:install=enabled installs no .pc"; return 1;; esac
  tests=$(meson test -C "$b" --list --no-rebuild 2>/dev/null | tr '\n' ' ')
  # Meson 1.0 lists "masklens:examples / example-quickstart", later ones "examples - masklens:example-quickstart".
  case "$tests" in *"masklens:examples / example-quickstart"* | *"examples - masklens:example-quickstart"*) ;;
    *) fail "-Dmasklens:examples=enabled adds no tests: '$tests'"; return 1;; esac
}
check meson-subproject meson_subproject

echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
