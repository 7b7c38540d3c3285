"""`python -m nemodrop`: the same as the installed `nemodrop` command."""

import sys

from nemodrop.cli import main

sys.exit(main())
