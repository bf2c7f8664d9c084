"""`python -m tf_lossscale demo|bench|migrate`."""

import sys

from tf_lossscale.cli import main

sys.exit(main())
