"""`python -m tf_lossscale demo|bench|migrate`."""

import sys

from tf_lossscale.cli import MODULE_PROG, main

if __name__ == "__main__":
    sys.exit(main(prog=MODULE_PROG))
