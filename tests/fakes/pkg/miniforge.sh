#!/bin/sh
# Fake Miniforge installer: `-b -p PREFIX` installs the fake conda.
while [ $# -gt 0 ]; do case $1 in -p) prefix=$2; shift ;; esac; shift; done
mkdir -p "$prefix/bin" "$prefix/conda-meta"
cp "$(cat /etc/fake-packages)/conda" "$prefix/bin/conda"
chmod 755 "$prefix/bin/conda"
echo "Miniforge3 installed in $prefix"
