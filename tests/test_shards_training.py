"""Training, validation and resuming from make_shards' output read from a local
folder, an HTTP server that serves byte ranges and moto's S3 server (all on
127.0.0.1, started here): the weights and the validation figures equal those of
the same run from the jpg folders the shards were made of, bit for bit; a
truncated shard, a shard that does not match its index and a dropped
connection each stop the run in one line."""
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch

import main
from datasets import storage
from tests.conftest import tiny_args
from tests.dist_helpers import main_worker
from tests.servers import S3_ENV, faulty_http_server, http_server, s3_server
from utils.checkpoint import load_checkpoint
from utils.logs import read_tsv
from utils.retention import checkpoint_name

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures('one_torch_thread', 'no_curves')
# 24 training videos, batch 8: 3 steps an epoch; a checkpoint after each.
RUN = ('--n_epochs', '1', '--checkpoint_steps', '1', '--manual_seed', '3')
TIMES = ('clips_per_s', 'data_wait', 'time', 'seconds')


@pytest.fixture(scope='module')
def from_files(tiny_synthetic, tmp_path_factory):
    """The run from the jpg folders: its result folder."""
    result = tmp_path_factory.mktemp('from_files')
    main.main(tiny_args(*tiny_synthetic, result, *RUN))
    return result


def location_args(kind, shards, http, s3, tmp_path):
    """--video_path (and its options) of the shards at a local folder, HTTP or S3."""
    if kind == 'folder':
        return [str(shards)]
    if kind == 'http':  # with the cache
        return [http + '/', '--shard_cache', str(tmp_path / 'cache')]
    return [s3[0], '--storage_options', json.dumps(s3[1])]


def run_args(tiny_synthetic, result, video_path, *extra):
    args = tiny_args(*tiny_synthetic, result, *RUN, *extra)
    args[args.index('--video_path') + 1:args.index('--video_path') + 2] = video_path
    return args


def assert_same_run(expected, got, checkpoint='save_1.pth'):
    a, b = load_checkpoint(expected / checkpoint), load_checkpoint(got / checkpoint)
    differences = [k for k in a['state_dict'] if not torch.equal(a['state_dict'][k], b['state_dict'][k])]
    assert not differences, differences
    for log in ('train.log', 'val.log'):  # the figures, not the times
        rows = [[{k: v for k, v in row.items() if k not in TIMES} for row in read_tsv(folder / log)]
                for folder in (expected, got)]
        assert rows[0] == rows[1], log


@pytest.mark.parametrize('kind', ['folder', 'http', 's3'])
def test_training_from_shards_equals_the_files(kind, tiny_synthetic, from_files, shards, http, s3, tmp_path,
                                               capsys):
    result = tmp_path / 'run'
    main.main(run_args(tiny_synthetic, result, location_args(kind, shards, http, s3, tmp_path)))
    out = capsys.readouterr().out
    assert 'reading 39 videos from the shards at' in out and 'file type hdf5, from their index' in out
    assert_same_run(from_files, result)
    opts = json.loads((result / 'opts.json').read_text())
    assert opts['file_type'] == 'jpg' and opts['run']['file_type'] == 'hdf5'  # options as given
    if kind == 'http':
        assert opts['video_path'] == http + '/'  # kept a URL, not folded into 'http:/127...'
        assert len(list((tmp_path / 'cache').glob('*.bin'))) == 36  # the 24 training and 12 validation videos


def test_resuming_mid_epoch_from_s3_equals_the_uninterrupted_run(tiny_synthetic, from_files, shards, s3, tmp_path):
    """The checkpoint of the files' run after 1 of 3 steps, resumed reading S3: the
    uninterrupted run's weights (the samplers, the random states and the records are
    those of the files)."""
    result = tmp_path / 'resumed'
    main.main(run_args(tiny_synthetic, result, location_args('s3', shards, None, s3, tmp_path),
                       '--resume_path', str(from_files / checkpoint_name(1, 1))))
    assert_same_run(from_files, result)


@pytest.mark.slow
def test_a_run_killed_mid_epoch_reading_http_resumes_to_the_uninterrupted_weights(tiny_synthetic, from_files,
                                                                                  shards, tmp_path):
    """SIGKILL once the first mid-epoch checkpoint exists (the server answers each
    video after 0.1 s, so the kill comes mid-epoch), then the same command with
    --auto_resume: the weights of the run from the files."""
    result = tmp_path / 'killed'
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    with faulty_http_server(shards, failures=0, match='shard-', delay=0.1) as (url, faults):
        command = [sys.executable, str(ROOT / 'main.py'), *run_args(tiny_synthetic, result, [url], '--auto_resume')]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while not (result / checkpoint_name(1, 1)).exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.02)
        proc.kill()
        proc.wait()
        assert not (result / 'save_1.pth').exists()
        faults['delay'] = 0
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    assert_same_run(from_files, result)


def s3_main_worker(ctx, argv):
    os.environ.update(S3_ENV)  # the pool's processes started before the S3 server
    main_worker(ctx, argv)


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['http', 's3'])
def test_two_process_validation_from_shards_equals_one_process(kind, tiny_synthetic, from_files, shards, http, s3,
                                                               tmp_path, rank_pool):
    """The files' checkpoint validated on 2 processes reading the shards: the 1-process
    figures (all-reduced sums of the same clips)."""
    result = tmp_path / 'two'
    args = run_args(tiny_synthetic, result, location_args(kind, shards, http, s3, tmp_path), '--distributed',
                    '--no_train', '--batch_size', '4', '--n_threads', '0', '--resume_path',
                    str(from_files / 'save_1.pth'))
    rank_pool.run(s3_main_worker if kind == 's3' else main_worker, args)
    one, two = read_tsv(from_files / 'val.log')[0], read_tsv(result / 'val.log')[0]
    assert float(two['loss']) == pytest.approx(float(one['loss']), abs=1e-6)
    assert two['acc'] == one['acc']


def test_the_frame_check_finds_videos_the_shards_lack_or_hold_too_few_frames_of(tiny_synthetic, shards, tmp_path,
                                                                               capsys):
    """--check_frames looks each record up in the index (no payload read): a video
    not packed and a segment longer than the packed video each named."""
    ann = json.loads(tiny_synthetic[1].read_text())
    ann['database']['train_grow_000']['annotations']['segment'] = [1, 30]  # 12 frames packed
    ann['database']['not_packed'] = {'subset': 'training', 'annotations': {'label': 'grow', 'segment': [1, 13]}}
    annotation = tmp_path / 'ann.json'
    annotation.write_text(json.dumps(ann))
    with mock.patch('datasets.storage.ShardStore.read_range', side_effect=AssertionError('a payload was read')):
        args = run_args((tiny_synthetic[0], annotation), tmp_path / 'r', [str(shards)])
        with pytest.raises(SystemExit):
            main.main(args)
    err = capsys.readouterr().err
    assert '2 of 25 videos are missing, too short or unreadable in the shards' in err, err
    assert 'grow/not_packed: not in the shard index of' in err
    assert 'grow/train_grow_000: needs 29 frames but has 12 (in the shard index)' in err
    assert 'util_scripts.make_shards' in err


def broken_copy(shards, tmp_path, damage):
    copy = tmp_path / 'shards'
    shutil.copytree(shards, copy)
    damage(copy)
    return copy


def run_fails(args, capsys):
    """The one error line of a run that stops; its loader workers are gone when
    main.main returns (utils/launch.py's release_frames), not 5 s a worker later."""
    before = set(multiprocessing.active_children())
    with pytest.raises(SystemExit) as e:
        main.main(args)
    left = set(multiprocessing.active_children()) - before
    assert not left, f'the failed run left {left} running'
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith('error: ')]
    assert e.value.code == 2 and len(lines) == 1 and 'Traceback' not in err, err
    return lines[0]


@pytest.mark.parametrize('kind', ['folder', 'http', 's3'])
def test_a_truncated_shard_is_one_line_naming_shard_and_video(kind, tiny_synthetic, shards, s3, tmp_path, capsys):
    def truncate(folder):
        with open(folder / 'shard-000001.tar', 'r+b') as f:
            f.truncate(10000)
    copy = broken_copy(shards, tmp_path, truncate)
    with http_server(copy) as url:
        if kind == 's3':  # the truncated copy beside the whole one, in the same bucket
            from s3fs import S3FileSystem
            url = s3[0].replace('/prefix', '/truncated')
            S3FileSystem(skip_instance_cache=True, **s3[1]).put(str(copy) + '/', url[5:] + '/', recursive=True)
        location = {'folder': [str(copy)], 'http': [url], 's3': [url, '--storage_options', json.dumps(s3[1])]}
        line = run_fails(run_args(tiny_synthetic, tmp_path / 'r', location[kind]), capsys)
    shard = str(copy) if kind == 'folder' else url
    assert f'{shard}/shard-000001.tar: video ' in line and 'is cut short' in line and 'truncated' in line, line


def test_a_shard_that_does_not_match_its_index_is_one_line(tiny_synthetic, shards, tmp_path, capsys):
    """Shards 1 and 2 swapped (same names, other contents): the tar header before each
    payload is checked against the index, so no video is decoded as another."""
    def swap(folder):
        a, b = folder / 'shard-000001.tar', folder / 'shard-000002.tar'
        a.rename(folder / 'tmp.tar')
        b.rename(a)
        (folder / 'tmp.tar').rename(b)
    copy = broken_copy(shards, tmp_path, swap)
    line = run_fails(run_args(tiny_synthetic, tmp_path / 'r', [str(copy)]), capsys)
    assert 'shard-00000' in line and 'do not match' in line and 'video ' in line, line


@pytest.mark.parametrize('skip', [False, True])
def test_a_dropped_connection_stops_the_run_in_one_line_after_the_retries(skip, tiny_synthetic, shards, tmp_path,
                                                                           capsys):
    """Every shard request's connection closed unanswered (the index still loads):
    retried, then one line naming the URL; --on_bad_video skip does not skip it."""
    extra = ['--on_bad_video', 'skip'] if skip else []
    with mock.patch.object(storage, 'BACKOFF_S', 0.01), \
            faulty_http_server(shards, failures=10**6, status='drop', match='shard-') as (url, faults):
        line = run_fails(run_args(tiny_synthetic, tmp_path / 'r', [url], *extra), capsys)
    assert f'{url}/shard-0000' in line and f'after {storage.RETRIES + 1} tries' in line, line
    assert faults['requests'] >= storage.RETRIES + 1
    assert not (tmp_path / 'r' / 'save_1.pth').exists()


def test_s3_going_away_mid_run_stops_it_in_one_line_after_the_retries(tiny_synthetic, shards, tmp_path, capsys):
    """The S3 server stopped when the first video is fetched (the index was read at
    start-up; no loader workers, so the fetch runs here): retried, then one line."""
    with s3_server(shards) as (url, options), mock.patch.object(storage, 'BACKOFF_S', 0.01):
        server = s3_server.last_server
        read_range = storage.ShardStore.read_range

        def stop_then_read(store, *args):
            server.stop()
            return read_range(store, *args)
        with mock.patch.object(storage.ShardStore, 'read_range', stop_then_read):
            args = run_args(tiny_synthetic, tmp_path / 'r', [url, '--storage_options', json.dumps(options)],
                            '--n_threads', '0')
            line = run_fails(args, capsys)
    assert f'{url}/shard-0000' in line and f'after {storage.RETRIES + 1} tries' in line, line


# The session's shards and their servers (tests/conftest.py), under this module's names.
@pytest.fixture(scope='module')
def shards(tiny_shards):
    return tiny_shards


@pytest.fixture(scope='module')
def http(shards_http):
    return shards_http


@pytest.fixture(scope='module')
def s3(shards_s3):
    return shards_s3
