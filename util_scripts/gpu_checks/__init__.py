"""The checks of the GPU self-check (util_scripts/gpu_check.py): common.py runs
main.py, torchrun and predict.py for them; single.py and throughput.py hold
the checks on one GPU, distributed.py those on two. Each module's @check
(common.new_registry) registers its checks with their time budgets and what
they prove; quick=True marks the GPU-only paths no GPU has run yet (--quick)."""
