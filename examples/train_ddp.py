"""Moved to ``experiments/train_ddp.py``: please run ``python -m experiments.train_ddp`` from the
repository root. This forward runs it with the same arguments, for one release."""

import os
import subprocess
import sys

if __name__ == "__main__":
    print("examples/train_ddp.py moved: please run python -m experiments.train_ddp (this forward "
          "goes in the next release)", file=sys.stderr)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])
    sys.exit(subprocess.call([sys.executable, "-m", "experiments.train_ddp", *sys.argv[1:]]))
