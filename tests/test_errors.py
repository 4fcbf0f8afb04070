"""Bad input gives one clear error naming the file, video or option (exit code 2),
raised before training where it can be checked up front."""
import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest

import main
from tests.conftest import tiny_args
from utils.checkpoint import load_checkpoint
from utils.failures import describe_failure
from utils.processes import child_pids

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def data_copy(tiny_synthetic, tmp_path):
    video_path, annotation_path = tiny_synthetic
    videos = tmp_path / 'jpg'
    shutil.copytree(video_path, videos)
    annotation = tmp_path / 'annotation.json'
    shutil.copy(annotation_path, annotation)
    return videos, annotation


def fails_with(capsys, args, *needles):
    with pytest.raises(SystemExit) as exc:
        main.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err
    assert 'Traceback' not in err and 'worker process' not in err  # the worker's own message
    assert err.startswith('error: ')
    return err


def first_training_video(annotation):
    data = json.loads(annotation.read_text())
    for vid, entry in data['database'].items():
        if entry['subset'] == 'training':
            return vid, entry, data
    raise AssertionError


def test_n_classes_mismatch(data_copy, tmp_path, capsys):
    args = tiny_args(*data_copy, tmp_path / 'r')
    args[args.index('--n_classes') + 1] = '7'
    fails_with(capsys, args, '--n_classes', '6 labels')


def test_missing_annotation_file(data_copy, tmp_path, capsys):
    fails_with(capsys, tiny_args(data_copy[0], tmp_path / 'nope.json', tmp_path / 'r'),
               'nope.json')


def test_label_not_in_labels(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, data = first_training_video(annotation)
    entry['annotations']['label'] = 'juggling'
    annotation.write_text(json.dumps(data))
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r'), 'juggling', vid)


def test_empty_subset(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    data = json.loads(annotation.read_text())
    data['database'] = {k: v for k, v in data['database'].items()
                        if v['subset'] != 'validation'}
    annotation.write_text(json.dumps(data))
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r'), 'validation')


def test_video_shorter_than_segment_fails_up_front(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    folder = videos / entry['annotations']['label'] / vid
    frames = sorted(folder.glob('image_*.jpg'))
    frames[-1].unlink()
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r'), vid)
    assert not (tmp_path / 'r' / 'train.log').exists()  # nothing trained


def test_missing_frame_inside_video(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    folder = videos / entry['annotations']['label'] / vid
    (folder / 'image_00003.jpg').unlink()  # the last frame is still there
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r', '--train_t_crop', 'center',
                                 '--sample_duration', '12'), 'image_00003.jpg')


def test_corrupt_frame(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    folder = videos / entry['annotations']['label'] / vid
    (folder / 'image_00002.jpg').write_bytes(b'not a jpeg')
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r', '--train_t_crop', 'center',
                                 '--sample_duration', '12'), 'image_00002.jpg')


def test_missing_video_path(data_copy, tmp_path, capsys):
    _, annotation = data_copy
    fails_with(capsys, tiny_args(tmp_path / 'missing', annotation, tmp_path / 'r'), 'missing')


def test_unknown_ft_begin_module(data_copy, tmp_path, capsys):
    args = tiny_args(*data_copy, tmp_path / 'r', '--ft_begin_module', 'layer9')
    fails_with(capsys, args, '--ft_begin_module', 'layer4')


def test_resume_of_other_architecture(data_copy, tmp_path, capsys):
    import torch
    path = tmp_path / 'other.pth'
    torch.save({'epoch': 1, 'arch': 'resnet-50', 'state_dict': {}}, path)
    fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r', '--resume_path', str(path)),
               'resnet-50', '--resume_path')


def test_checkpoint_with_pickled_code_is_refused(data_copy, tmp_path, capsys):
    import torch

    class Evil:
        def __reduce__(self):
            return (print, ('executed',))

    path = tmp_path / 'evil.pth'
    torch.save({'epoch': 1, 'arch': 'resnet-10', 'state_dict': {}, 'x': Evil()}, path)
    capsys.readouterr()
    fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r', '--resume_path', str(path)),
               'evil.pth', 'weights_only')
    assert 'executed' not in capsys.readouterr().out


@pytest.mark.parametrize('option, value', [('--sample_size', '0'), ('--n_threads', '-1'),
                                           ('--learning_rate', '-0.1'), ('--checkpoint', '0'),
                                           ('--sample_duration', '0'), ('--dist_timeout', '0')])
def test_bad_option_values_stop_before_anything_runs(data_copy, tmp_path, capsys, option, value):
    err = fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r', option, value),
                     f'{option} must be at least')
    assert f'(got {value})' in err or f'(got {float(value)})' in err
    assert not (tmp_path / 'r').exists()


def test_result_path_that_is_a_file(data_copy, tmp_path, capsys):
    (tmp_path / 'r').write_text('x')
    fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r'), '--result_path', 'is a file')


def test_result_folder_that_refuses_new_files(data_copy, tmp_path, capsys, monkeypatch):
    # As root, chmod cannot make a folder read-only: refuse the probe file instead.
    def refuse(self, data):
        raise PermissionError(13, 'Permission denied')

    monkeypatch.setattr(pathlib.Path, 'write_bytes', refuse)
    fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r'), 'cannot create files in result '
               'folder', 'Permission denied')
    assert not (tmp_path / 'r' / 'opts.json').exists()


@pytest.mark.slow
def test_disk_full_at_a_checkpoint_keeps_the_last_good_one(data_copy, tmp_path, capsys,
                                                           monkeypatch):
    import torch
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if obj.get('epoch') == 2:
            f.write(b'partial')
            raise RuntimeError('unexpected pos 704 vs 598') from OSError(
                errno.ENOSPC, 'No space left on device')
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, 'save', save)
    result = tmp_path / 'r'
    err = fails_with(capsys, tiny_args(*data_copy, result, '--n_epochs', '3', '--checkpoint', '1',
                                       '--no_val'), 'save_2.pth', 'No space left on device',
                     'earlier checkpoints are intact')
    assert 'unexpected pos' not in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(torch, 'save', real_save)
    assert sorted(p.name for p in result.glob('*save_*')) == ['save_1.pth']
    assert load_checkpoint(result / 'save_1.pth')['epoch'] == 1


def test_resume_from_a_file_that_is_not_a_checkpoint(data_copy, tmp_path, capsys):
    notes = tmp_path / 'notes.txt'
    notes.write_text('epoch 3 looked good\n')
    err = fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r', '--resume_path', str(notes)),
                     'notes.txt is not a checkpoint')
    assert ': 101' not in err


@pytest.mark.slow
def test_short_videos_are_counted_once(data_copy, tmp_path, capsys):
    main.main(tiny_args(*data_copy, tmp_path / 'r', '--sample_duration', '16', '--n_epochs', '1',
                        '--no_val'))
    out = capsys.readouterr().out
    assert out.count('warning: 24 of 24 training videos are shorter than a clip') == 1


def test_missing_frame_found_up_front_by_check_frames_all(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    (videos / entry['annotations']['label'] / vid / 'image_00005.jpg').unlink()
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r'), vid, 'image_00005.jpg',
               '--check_frames all')
    assert not (tmp_path / 'r' / 'train.log').exists()


def test_corrupt_frame_found_up_front_by_check_frames_decode(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    (videos / entry['annotations']['label'] / vid / 'image_00004.jpg').write_bytes(b'')
    main.main(tiny_args(videos, annotation, tmp_path / 'a', '--n_epochs', '0'))  # all: passes
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r', '--check_frames', 'decode'),
               'image_00004.jpg', 'empty')
    assert not (tmp_path / 'r' / 'train.log').exists()


@pytest.mark.slow
def test_bad_video_skipped_during_training(data_copy, tmp_path, capfd):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    for p in (videos / entry['annotations']['label'] / vid).glob('*.jpg'):
        p.write_bytes(b'not a jpeg')
    args = tiny_args(videos, annotation, tmp_path / 'r', '--n_epochs', '2', '--no_val',
                     '--check_frames', 'all', '--on_bad_video', 'skip', '--tensorboard')
    main.main(args)
    captured = capfd.readouterr()
    assert captured.err.count(f'skipping video {vid}') == 1
    assert captured.out.count('skipped 1 samples of bad videos') == 2  # once per epoch
    # Without skip the same run stops with the video's name.
    fails_with(capfd, tiny_args(videos, annotation, tmp_path / 'e', '--no_val'), vid)


@pytest.mark.slow
def test_a_killed_loader_worker_ends_the_run_in_one_line(data_copy, tmp_path):
    """SIGKILL of a DataLoader worker, as the kernel's out-of-memory killer does:
    one line naming the signal, the likely cause and what to lower, exit 1
    (before: a 27-line traceback ending in 'DataLoader worker (pid N) is killed
    by signal: Killed', raised inside backward by the SIGCHLD handler)."""
    result = tmp_path / 'r'
    cmd = [sys.executable, str(ROOT / 'main.py'), *tiny_args(
        *data_copy, result, '--n_epochs', '40', '--n_threads', '2', '--no_val')]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS='1'),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (result / 'train_batch.log').exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1]
            time.sleep(0.05)
        # Every worker found until the run ends: one that was already leaving
        # at the end of an epoch is no error.
        while proc.poll() is None and time.time() < deadline:
            for pid in child_pids(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert len(err.strip().splitlines()) == 1 and 'Traceback' not in err, err
    assert err.startswith('error: DataLoader worker (pid ')
    for needle in ('SIGKILL', "out-of-memory killer", '--n_threads (2)', '--batch_size (8)',
                   '--sample_size (32)', '--auto_resume', 'exit 1'):
        assert needle in err, err


OPTIONS = types.SimpleNamespace(dist_timeout=2, n_threads=4, batch_size=16, sample_size=112)
GLOO_RESET = ('[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error '
              '[127.0.0.1]:22732: Connection reset by peer. This is typically caused by a '
              'remote worker hanging or bugs in the application.')


def raised(*messages):
    """The error raised while handling the ones before it (a chain, as Python builds it)."""
    try:
        if len(messages) > 1:
            try:
                raise raised(*messages[:-1])
            except RuntimeError:
                raise RuntimeError(messages[-1])  # noqa: B904 - the chain is the point
        raise RuntimeError(messages[0])
    except RuntimeError as e:
        return e


def test_a_dead_peer_is_reported_not_the_workers_torchrun_ended_after_it():
    error = raised(GLOO_RESET, 'DataLoader worker (pid 9555) is killed by signal: Terminated. ')
    assert isinstance(error.__context__, RuntimeError)
    line = describe_failure(error, OPTIONS, rank=0)
    assert line.startswith('error: rank 0: ')
    assert 'failed: connection reset by peer: another process of the job died' in line
    assert 'Terminated' not in line and 'GLHF' not in line and '\n' not in line


@pytest.mark.parametrize('message, needles', [
    ('Timed out waiting 2000ms for recv operation to complete',
     ['timed out (--dist_timeout 2 s)', 'froze']),
    ('DataLoader worker (pid 12) is killed by signal: Bus error. ',
     ['SIGBUS', '/dev/shm', '--n_threads (4)']),
    ('DataLoader worker (pid(s) 12, 13) exited unexpectedly',
     ['(pid 12, 13)', "out-of-memory killer", '--sample_size (112)']),
    ('DataLoader worker (pid 12) exited unexpectedly with exit code 3. Details are lost',
     ['exited with status 3', '--n_threads 0']),
    ('DataLoader worker (pid 12) is killed by signal: Segmentation fault. ',
     ['SIGSEGV', '--n_threads 0']),
])
def test_failures_in_one_line(message, needles):
    line = describe_failure(raised(message), OPTIONS)
    assert line.startswith('error: ') and '\n' not in line
    for needle in needles:
        assert needle in line, line
    assert line.endswith('(exit 1, on which torchrun --max-restarts restarts the job)')


def test_other_errors_are_not_described():
    assert describe_failure(raised('mat1 and mat2 shapes cannot be multiplied'), OPTIONS) is None
    assert describe_failure(ValueError('Connection reset by peer'), OPTIONS) is None


@pytest.mark.parametrize('capability, refused', [((7, 0), True), ((7, 5), True), ((8, 0), False)])
def test_bf16_on_a_gpu_below_compute_capability_8_is_refused_in_one_line(
        data_copy, tmp_path, capsys, monkeypatch, capability, refused):
    """A faked GPU: the check runs before anything touches CUDA."""
    import torch

    from utils import distributed as du
    from utils.precision import refuse_bf16_below_sm80
    monkeypatch.setattr(du, 'select_device', lambda no_cuda, local_rank: torch.device('cuda', 0))
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'Tesla V100-SXM2-16GB')
    args = tiny_args(*data_copy, tmp_path / 'r', '--amp', '--amp_dtype', 'bf16')
    if refused:
        err = fails_with(capsys, args, '--amp_dtype bf16 needs a GPU of compute capability 8.0',
                         f'Tesla V100-SXM2-16GB has {capability[0]}.{capability[1]}',
                         '--amp_dtype fp16')
        assert len(err.strip().splitlines()) == 1
    else:
        opt = main.parse_opts(args)
        refuse_bf16_below_sm80(opt.amp, opt.amp_dtype, torch.device('cuda', 0))
