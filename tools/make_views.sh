#!/bin/sh
# make_views.sh OUT "SRC_DIRS" "CUDA_USES" - the include folders the Makefile
# compiles each part of the tree against, so that the compiler sees only what
# the layers (docs/layers.md) allow:
#   OUT/<dir>/    for src/<dir>: the public headers (not *_int.h) of <dir> and
#                 of the folders before it in SRC_DIRS, each under its folder
#                 name (OUT/runtime/core/err.h); src/cuda's public headers from
#                 the highest folder the plugin uses on (the plugin's layer)
#   OUT/cuda/     for src/cuda: the folders in CUDA_USES and cuda's own
#   OUT/public/   for daemon/ and tools/: autocompress.h and every public
#                 header it names
# A folder's private headers are included by their bare name and found next
# to the file that includes them, never through a view. Links, not copies:
# an edit to a header is seen at once. Rebuilt whole each time (it is cheap).
set -eu
out=$1
dirs=$2
cuda_uses=$3
root=$(pwd)
tmp="$out.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"

# link_public VIEW FOLDER: FOLDER's public headers into VIEW/FOLDER/
link_public() {
  mkdir -p "$tmp/$1/$2"
  for h in "$root/src/$2"/*.h; do
    [ -e "$h" ] || continue
    case $h in *_int.h) continue ;; esac
    ln -s "$h" "$tmp/$1/$2/"
  done
}

cuda_layer=""
for d in $cuda_uses; do cuda_layer=$d; done  # listed in SRC_DIRS order
below=""
cuda_seen=""
for d in $dirs; do
  below="$below $d"
  [ "$d" = "$cuda_layer" ] && cuda_seen=cuda
  for f in $below $cuda_seen; do link_public "$d" "$f"; done
done
for f in $cuda_uses cuda; do link_public cuda "$f"; done
for f in $dirs cuda; do link_public public "$f"; done
ln -s "$root/src/autocompress.h" "$tmp/public/autocompress.h"

rm -rf "$out"
mv "$tmp" "$out"
