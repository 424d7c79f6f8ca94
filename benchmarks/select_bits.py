"""Moved to ``experiments/select_bits.py``: please run ``python -m experiments.select_bits``. This
forward runs it with the same arguments, for one release."""

import sys

from experiments.select_bits import main

if __name__ == "__main__":
    print("benchmarks/select_bits.py moved: please run python -m experiments.select_bits (this "
          "forward goes in the next release)", file=sys.stderr)
    main()
