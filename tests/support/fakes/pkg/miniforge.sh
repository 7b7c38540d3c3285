#!/bin/sh
# Fake Miniforge installer: `-b [-u] -p PREFIX` installs the fake conda. Like the real one, it
# refuses a PREFIX that exists unless -u (update) is given.
update=0
while [ $# -gt 0 ]; do case $1 in -p) prefix=$2; shift ;; -u) update=1 ;; esac; shift; done
if [ -e "$prefix" ] && [ "$update" = 0 ]; then
  echo "ERROR: File or directory already exists: '$prefix'" >&2
  echo "If you want to update an existing installation, use the -u option." >&2
  exit 1
fi
mkdir -p "$prefix/bin" "$prefix/conda-meta"
cp "$(cat /etc/fake-packages)/conda" "$prefix/bin/conda"
chmod 755 "$prefix/bin/conda"
echo "Miniforge3 installed in $prefix"
