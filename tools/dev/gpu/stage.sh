#!/usr/bin/env bash
# On the GPU machine, in the working tree: keeps one part folder of .device-gpu/ (sent with this command)
# in /tmp/stage for the commands after it; /tmp stays while the machine is kept.
#
#   bash tools/dev/gpu/stage.sh .device-gpu/p07
set -eu
folder=${1:?usage: stage.sh .device-gpu/pNN}
mkdir -p /tmp/stage
cp "$folder"/* /tmp/stage/
echo "staged $(ls /tmp/stage | grep -c '^part') parts, $(du -sh /tmp/stage | cut -f1)"
