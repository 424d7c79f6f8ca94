"""Moved to ``experiments/trace_training.py``: please run ``python -m experiments.trace_training``. This
forward runs it with the same arguments, for one release."""

import sys

from experiments.trace_training import main

if __name__ == "__main__":
    print("benchmarks/trace_training.py moved: please run python -m experiments.trace_training (this "
          "forward goes in the next release)", file=sys.stderr)
    main()
