"""`python -m tfshards.cli`: the same as the `tfshards` command."""

import sys

from tfshards.cli import main

sys.exit(main())
