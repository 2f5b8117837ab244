"""`python -m eqx_specdec`: the command line."""

import sys

from ._cli.main import main


if __name__ == "__main__":
    sys.exit(main())
