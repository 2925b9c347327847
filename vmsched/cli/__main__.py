"""``python -m vmsched.cli``: the ``vmsched`` command."""

import sys

from vmsched.cli import main

sys.exit(main())
