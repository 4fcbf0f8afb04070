"""Start-up under DDP: one rank per node (local rank 0) builds the record index
and runs the frame check; the node's other ranks wait and read the index it
cached; a failed check stops every rank with the same message (2 gloo ranks)."""
import os
import shutil

import pytest

import dataset as data
import main
from opts import parse_opts
from tests.conftest import tiny_args
from tests.dist_helpers import run_ranks
from utils.distributed import DistContext


def _count_checks_and_load(ctx, tiny, result, log_dir):
    """Builds the training set on this rank, counting check_videos calls and
    keeping the error each rank raised."""
    os.environ['XDG_CACHE_HOME'] = str(log_dir / 'cache')  # no frame-check cache from earlier
    checked = data.check_videos

    def counting(*args, **kwargs):
        with open(log_dir / 'checks', 'a') as f:
            f.write(f'{ctx.rank}\n')
        return checked(*args, **kwargs)
    data.check_videos = counting
    opt = parse_opts(tiny_args(*tiny, result))
    record, _ = main.prepare(opt, DistContext())
    try:
        train_set, _ = data.get_training_data(opt, record, ctx)
        (log_dir / f'videos{ctx.rank}').write_text(str(len(train_set)))
    except data.DataError as e:
        (log_dir / f'error{ctx.rank}').write_text(str(e))


@pytest.mark.slow  # two ranks in processes
def test_the_frame_check_runs_once_per_node_and_every_rank_gets_the_records(
        tiny_synthetic, tmp_path):
    run_ranks(_count_checks_and_load, 2, tiny_synthetic, tmp_path / 'r', tmp_path)
    assert (tmp_path / 'checks').read_text().split() == ['0']  # 2 ('0', '1') before
    videos = [(tmp_path / f'videos{r}').read_text() for r in range(2)]
    assert videos[0] == videos[1] == '24'


@pytest.mark.slow  # two ranks in processes
def test_a_failed_check_stops_every_rank_with_the_same_message(tiny_synthetic, tmp_path):
    video_path, annotation_path = tiny_synthetic
    copy = tmp_path / 'jpg'
    shutil.copytree(video_path, copy)
    gone = sorted(p for p in copy.glob('*/*') if p.is_dir())[0]
    shutil.rmtree(gone)
    run_ranks(_count_checks_and_load, 2, (copy, annotation_path), tmp_path / 'r', tmp_path)
    errors = [(tmp_path / f'error{r}').read_text() for r in range(2)]
    assert errors[0] == errors[1] and f'{gone}: folder missing' in errors[0]
    assert (tmp_path / 'checks').read_text().split() == ['0']


def _slow_check_under_a_short_timeout(rank, port, tiny, result, log_dir):
    """Rank 0's check takes 8 s; the process group's collectives time out after 3 s."""
    import datetime
    import time

    import torch
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=3))
    checked = data.check_videos

    def slow(*args, **kwargs):
        time.sleep(8)
        return checked(*args, **kwargs)
    data.check_videos = slow
    try:
        ctx = DistContext(rank=rank, local_rank=rank, world_size=2,
                          device=torch.device('cpu'), distributed=True)
        _count_checks_and_load(ctx, tiny, result, log_dir)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two ranks in processes
def test_the_others_wait_for_a_check_longer_than_the_collective_timeout(tiny_synthetic, tmp_path):
    """--check_frames decode can take hours; the ranks waiting for it must not
    fail at the start-up collectives' timeout (they did with 3 s here when the
    wait was on the process group)."""
    import torch.multiprocessing as mp

    from utils.distributed import free_port
    mp.spawn(_slow_check_under_a_short_timeout, nprocs=2, join=True,
             args=(free_port(), tiny_synthetic, tmp_path / 'r', tmp_path))
    assert [(tmp_path / f'videos{r}').read_text() for r in range(2)] == ['24', '24']
