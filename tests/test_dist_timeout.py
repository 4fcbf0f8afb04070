"""--dist_timeout: a frozen rank makes the others' next collective fail."""
import time

import torch

from tests.dist_helpers import run_ranks
from utils.distributed import set_collective_timeout


def late_all_reduce(ctx, out_dir):
    set_collective_timeout(ctx, 2)
    if ctx.rank == 1:
        time.sleep(8)  # frozen for longer than the timeout, then back
    try:
        torch.distributed.all_reduce(torch.ones(1))
        result = 'completed'
    except RuntimeError as e:
        result = f'failed: {type(e).__name__}'
    (out_dir / f'rank{ctx.rank}').write_text(result)


def test_collective_fails_after_the_timeout_instead_of_waiting(tmp_path):
    run_ranks(late_all_reduce, 2, tmp_path)
    # Without the 2 s timeout rank 0 would simply wait the 8 s and complete.
    assert (tmp_path / 'rank0').read_text().startswith('failed')
