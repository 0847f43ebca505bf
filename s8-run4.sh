#!/bin/bash
# Session 8 run 4: where one device read's time goes (tiles_torch --split).
set -u
mkdir -p $OUT/r
trap 'cd $OUT && tar czf r.tar.gz r' EXIT
R=$OUT/r
printf "[binaries]\npython = '%s'\n" "$(command -v python3)" > /tmp/python.ini
meson setup bp --buildtype=release -Dcuda=enabled -Dgpu_archs=90 -Dpython=enabled -Dtests=disabled -Dtools=disabled -Dbenchmarks=disabled -Dexamples=disabled --native-file=/tmp/python.ini > $R/setup-py.txt 2>&1 || echo "setup py failed"
ninja -C bp > $R/build-py.txt 2>&1; echo "py build rc $?"
export MASKLENS_PYTHONPATH=$PWD/bp/python PYTHONPATH=$PWD/bp/python:${PYTHONPATH:-}
timeout 240 python3 bench/tiles_torch.py --device cuda --lengths 32768,65536 --split > $R/split.txt 2>&1; echo "split rc $?"; grep -v "^\s*$" $R/split.txt | head -30
