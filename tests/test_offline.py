"""Without the Planetoid files and without a network, the tests that need data skip
cleanly: nothing fails, nothing hangs on a download."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the test files and modules that read a dataset
NEEDS_DATA = ["tests/test_datasets.py", "tests/experiments/test_train_cora.py",
              "tests/experiments/test_bits_pareto.py", "tests/examples/test_short_examples.py",
              "fxquant/datasets.py"]


@pytest.mark.slow
def test_no_data_no_network_gives_skips_not_failures(tmp_path):
    """The data folder hidden, every download refused: the run passes with skips."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(FXQUANT_DATA=str(tmp_path / "no-data"), FXQUANT_CACHE=str(tmp_path / "cache"),
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
               no_proxy="", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-m", "not slow", *NEEDS_DATA], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:]
    assert "skipped" in summary and "failed" not in summary and "error" not in summary
