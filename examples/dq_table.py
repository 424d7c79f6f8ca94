"""Moved to ``experiments/dq_table.py``: please run ``python -m experiments.dq_table`` from the
repository root. This forward runs it with the same arguments, for one release."""

import os
import subprocess
import sys

if __name__ == "__main__":
    print("examples/dq_table.py moved: please run python -m experiments.dq_table (this forward "
          "goes in the next release)", file=sys.stderr)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])
    sys.exit(subprocess.call([sys.executable, "-m", "experiments.dq_table", *sys.argv[1:]]))
