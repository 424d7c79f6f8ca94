"""Moved to ``experiments/heldout_bits.py``: please run ``python -m experiments.heldout_bits``. This
forward runs it with the same arguments, for one release."""

import sys

from experiments.heldout_bits import main

if __name__ == "__main__":
    print("benchmarks/bench_heldout_bits.py moved: please run python -m experiments.heldout_bits (this "
          "forward goes in the next release)", file=sys.stderr)
    main()
