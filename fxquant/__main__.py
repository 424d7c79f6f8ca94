"""``python -m fxquant``: see :mod:`fxquant.cli`."""

import sys

from fxquant.cli import main

sys.exit(main())
