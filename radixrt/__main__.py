"""`python -m radixrt ...`: the same commands as the `radixrt` script (radixrt/cli.py)."""

import sys

from radixrt.cli import main

if __name__ == "__main__":
    sys.exit(main())
