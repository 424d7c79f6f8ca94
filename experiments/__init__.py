"""The experiments behind fxquant's published results: drivers, their training loop and
statistics (not installed with fxquant; run from the repository root).

    python -m experiments.train_cora --sweep 32,16,12,10,9,8 --json sweep.json
    python -m experiments.dq_table --dataset Cora --model gcn --seeds 10
    python -m experiments.bits_pareto --method recommended --target-bits 2
    torchrun --nproc-per-node 2 -m experiments.train_ddp --format int8 --sites all

Modules: :mod:`experiments.training` (data, the GCN, the training loop),
:mod:`experiments.stats` (paired differences and their t intervals),
:mod:`experiments.cli` (command-line values and usage errors), :mod:`experiments.graphs`
(synthetic graphs), and the drivers ``train_cora``, ``bits_pareto``, ``dq_table``,
``train_ddp``, ``select_bits``, ``trace_training`` and ``heldout_bits``. They use fxquant's
public API only (a test checks the imports), as any user's code would.
"""
