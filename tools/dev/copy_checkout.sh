#!/usr/bin/env bash
# Copies the checkout's files (tracked, or new and not ignored) into DEST, an existing directory.
#
#   tools/dev/copy_checkout.sh DEST
#
# pip and `python -m build` write setuptools' build/ and .egg-info into the tree they build
# from: building a copy keeps what an earlier build left out of the result, and lets two
# builds of one checkout run side by side (CI's two TensorFlow legs) without racing on build/.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:?usage: tools/dev/copy_checkout.sh DEST}
git ls-files -z --cached --others --exclude-standard |
    tar --null --files-from=- --ignore-failed-read -cf - | tar -xf - -C "$dest"
