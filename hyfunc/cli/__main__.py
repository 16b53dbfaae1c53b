"""`python -m hyfunc.cli`: the `hyfunc` command without the installed script."""
import sys

from hyfunc.cli import main

sys.exit(main())
