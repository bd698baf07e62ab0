#!/usr/bin/env bash
# Builds .device-gpu/ in the checkout this script belongs to: the wheels of wheels.txt (TensorFlow's CUDA
# build, the CUDA 12 and cuDNN 9 libraries it loads, Keras, pytest) for Python 3.12 on x86-64 Linux, as one
# uncompressed tar (the wheels are compressed already) split into parts of 61 MiB, one folder each:
# .device-gpu/p00/part00, p01/part01, ... The last folder also holds manifest.txt (every part's name and
# size), which setup.sh checks before unpacking. Each part goes to the GPU machine with a command of its own
# (tools/dev/gpu/stage.sh), under the 64 MiB a command may take with it.
#
#   bash tools/dev/gpu/prepare.sh        (downloads ~2.9 GB once into ~/.cache/amp-device-gpu; then ~1 min)
#
# The wheels travel slimmed (tools/dev/gpu/slim.sh says what it leaves out): 1.9 GB, 31 parts.
#
# .device-gpu/ is in .gitignore: it is never committed, and never copied with the working tree unless named.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
cache=${XDG_CACHE_HOME:-$HOME/.cache}/amp-device-gpu
out=.device-gpu
part_size=61m
wanted=$(grep -v '^#' "$here/wheels.txt" | grep -v '^$')
mkdir -p "$cache/whl"
# pip skips a wheel the pool holds already, so a changed list downloads only what it adds.
# shellcheck disable=SC2086 # one argument per pinned requirement
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$cache/whl" $wanted
# Exactly the listed wheels, in sorted order: the same list makes the same tar, and the same parts.
chosen=$(printf '%s\n' "$wanted" | python3 -c '
import re, sys
from pathlib import Path
pool = sorted(Path(sys.argv[1]).glob("*.whl"))
def norm(name): return re.sub(r"[-_.]+", "_", name).lower()
for line in sys.stdin.read().split():
    name, version = line.split("==")
    found = [w.name for w in pool if norm(w.name.split("-")[0]) == norm(name) and w.name.split("-")[1] == version]
    if len(found) != 1:
        sys.exit(f"prepare.sh: {len(found)} wheels for {line} in {sys.argv[1]}")
    print(found[0])
' "$cache/whl" | LC_ALL=C sort)
# shellcheck disable=SC2086 # one argument per wheel
bash "$here/slim.sh" "$cache/whl" "$cache/slim" $chosen
rm -rf "$out"; mkdir -p "$out"
printf '%s\n' "$chosen" | tar cf - -C "$cache/slim" --owner=0 --group=0 --numeric-owner --mtime=@0 -T - \
  | split -b "$part_size" -d -a 2 - "$out/part"
n=0
for part in "$out"/part*; do
  folder=$(printf '%s/p%02d' "$out" "$n"); mkdir -p "$folder"; mv "$part" "$folder/"; n=$((n + 1))
done
(cd "$out" && for part in p*/part*; do printf '%s %s\n' "$(basename "$part")" "$(stat -c %s "$part")"; done) \
  > "$folder/manifest.txt"
echo "$n parts in $out (p00 .. $(basename "$folder")); manifest.txt is in $(basename "$folder")"
du -sh "$out"
