"""The front's waker, a package the wake phase installs whole (lib.sh install_tree) and its unit
runs as `python3 -m wake`: see __main__.py."""

# Nothing imported here: `-m wake` runs __main__.py, which imports what it runs, and a test
# imports the one module it tests.
