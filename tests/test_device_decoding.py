"""--decode_device cuda: the loader workers read the JPEG bytes and plan the crop,
the main process decodes the batch where the batch goes, then crops, resizes,
augments and normalizes there. On the CPU the same code decodes with
simplejpeg at the workers' DCT reduction: its clips equal the worker path's."""
import dataclasses

import pytest
import torch

import dataset as data
import main
from datasets.device_batches import BatchDecoder
from datasets.device_jpeg import CpuJpeg, device_jpeg_decoder
from datasets.loader import DeferredBatch, DeferredClip
from opts import parse_opts
from tests.conftest import tiny_args
from tests.test_datasets import parsed, prepared
from utils.distributed import DistContext
from utils.errors import DataError, OptionError
from utils.resumable_data import start_epoch

CPU = DistContext()
BUILDERS = {'train': (data.get_training_data, data.make_train_loader),
            'val': (data.get_validation_data, data.make_val_loader),
            'infer': (data.get_inference_data, data.make_inference_loader)}


def first_batches(opt, record, which, n=2):
    """The first n batches of the `which` loader, as the model gets them."""
    build, make = BUILDERS[which]
    dataset, _ = build(opt, record)
    loader = make(dataset, opt, CPU)
    assert (loader.to_device.decoder is not None) == record.decode_on_device
    data.seed_worker_rngs(0)
    if which == 'train':
        start_epoch(loader.loader, 1)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n:
            break
    return batches


def both_paths(tiny, tmp_path, which, *extra):
    opt, record = prepared(tiny, tmp_path, '--n_threads', '0', *extra)
    workers = first_batches(opt, record, which)
    deferred = first_batches(opt, dataclasses.replace(record, decode_on_device=True), which)
    return workers, deferred


@pytest.mark.parametrize('which, extra', [
    ('train', ()), ('train', ('--train_crop', 'corner')), ('val', ()),
    ('infer', ('--inference_crop', 'three')), ('infer', ('--inference_crop', 'nocrop')),
    ('train', ('--normalize_on_device', 'on', '--channels_last')),
    ('train', ('--sample_size', '8')), ('val', ('--sample_size', '12'))])  # decoded at 1/2+
def test_clips_decoded_in_the_main_process_equal_the_workers(tiny_synthetic, tmp_path, which,
                                                             extra):
    workers, deferred = both_paths(tiny_synthetic, tmp_path, which, *extra)
    for (x, *rest), (y, *rest_y) in zip(workers, deferred):
        assert x.dtype == y.dtype == torch.float32 and x.shape == y.shape
        assert torch.equal(x, y)
        assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                   for a, b in zip(rest[:1], rest_y[:1]))


@pytest.mark.parametrize('extra', [(), ('--colorjitter',), ('--randaugment', '2', '9'),
                                   ('--random_erasing', '0.5'),
                                   ('--colorjitter', '--randaugment', '1', '15',
                                    '--random_erasing', '1', '--train_crop', 'corner')])
def test_random_steps_continue_the_workers_stream_where_the_frames_are_decoded(
        tiny_synthetic, tmp_path, extra):
    """With the training defaults (horizontal flips on: the tiny runs have
    --no_hflip) and every random step, the main process continues each item's
    random stream from where its worker planned the crop: the worker path's
    clips, three batches of them, some flipped, some not."""
    args = [a for a in tiny_args(*tiny_synthetic, tmp_path / 'r') if a != '--no_hflip']
    opt = parse_opts(args + ['--n_threads', '0', *extra])
    record, _ = main.prepare(opt, CPU)
    workers = first_batches(opt, record, 'train', 3)
    deferred = first_batches(opt, dataclasses.replace(record, decode_on_device=True), 'train', 3)
    for (x, y), (x_d, y_d) in zip(workers, deferred):
        assert torch.equal(y, y_d)
        assert torch.equal(x, x_d), [torch.equal(a, b) for a, b in zip(x, x_d)]
    if not extra:  # the flips are drawn: against the same crops without them
        no_flip = first_batches(parse_opts(args + ['--n_threads', '0', '--no_hflip']), record,
                                'train', 3)
        mirrored = [torch.equal(a.flip(-1), b) and not torch.equal(a, b)
                    for (x, _), (x_d, _) in zip(no_flip, deferred) for a, b in zip(x, x_d)]
        assert any(mirrored) and not all(mirrored)


@pytest.fixture(scope='module')
def tiny_hdf5(tiny_synthetic, tmp_path_factory):
    """tiny_synthetic's frames in hdf5 files (dataset 'video': the same JPEG bytes)."""
    import h5py
    import numpy as np
    video_path, annotation_path = tiny_synthetic
    root = tmp_path_factory.mktemp('hdf5')
    for folder in video_path.glob('*/*'):
        frames = sorted(folder.glob('image_*.jpg'))
        target = root / folder.parent.name / f'{folder.name}.hdf5'
        target.parent.mkdir(parents=True, exist_ok=True)
        with h5py.File(target, 'w') as f:
            ds = f.create_dataset('video', (len(frames),), dtype=h5py.vlen_dtype(np.uint8))
            for p, frame in enumerate(frames):
                ds[p] = np.frombuffer(frame.read_bytes(), dtype=np.uint8)
    return root, annotation_path


@pytest.mark.parametrize('which', ['train', 'val'])
def test_hdf5_clips_decoded_in_the_main_process_equal_the_workers(tiny_hdf5, tmp_path, which):
    workers, deferred = both_paths(tiny_hdf5, tmp_path, which, '--file_type', 'hdf5')
    for (x, *_), (y, *_) in zip(workers, deferred):
        assert torch.equal(x, y)


def test_without_a_gpu_decode_device_cuda_is_one_line(tiny_synthetic, tmp_path):
    opt = parsed(tiny_synthetic, tmp_path, '--decode_device', 'cuda')
    with pytest.raises(OptionError) as e:
        main.prepare(opt, CPU)
    assert str(e.value).startswith('--decode_device cuda needs a CUDA GPU, and this process '
                                   'runs on cpu') and '\n' not in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU decoder may be there')
def test_without_a_gpu_decoder_the_loaders_are_refused_in_one_line():
    with pytest.raises(OptionError) as e:
        device_jpeg_decoder(torch.device('cuda', 0))
    text = str(e.value)
    assert text.startswith('--decode_device cuda found no GPU JPEG decoder that runs on cuda:0')
    assert 'nvImageCodec: ' in text and 'torchvision.io.decode_jpeg (nvjpeg): ' in text
    assert 'pip install nvidia-nvimgcodec' in text and '\n' not in text


@pytest.mark.parametrize('extra', [('--file_type', 'video'), ('--file_type', 'hdf5',
                                                               '--input_type', 'flow')])
def test_decode_device_cuda_is_for_rgb_jpeg_frames(tiny_synthetic, tmp_path, capsys, extra):
    with pytest.raises(SystemExit):
        parsed(tiny_synthetic, tmp_path, '--decode_device', 'cuda', *extra)
    assert '--decode_device cuda decodes RGB JPEG frames' in capsys.readouterr().err


def test_a_corrupt_frame_decoded_in_the_main_process_is_named(tiny_synthetic, tmp_path):
    import shutil
    video_path, annotation_path = tiny_synthetic
    copy = tmp_path / 'jpg'
    shutil.copytree(video_path, copy)
    bad = sorted(copy.glob('*/*/image_00003.jpg'))
    for frame in bad:
        frame.write_bytes(b'not a jpeg at all')
    opt, record = prepared((copy, annotation_path), tmp_path, '--n_threads', '0')
    with pytest.raises(DataError) as e:
        first_batches(opt, dataclasses.replace(record, decode_on_device=True), 'val')
    assert 'image_00003.jpg' in str(e.value) and 'is corrupt' in str(e.value)


@pytest.mark.gpu
def test_the_gpu_decoder_matches_the_cpu_within_the_decoders_rounding(tiny_synthetic, tmp_path):
    """nvImageCodec / nvjpeg at full size + crop and resize on the GPU against
    simplejpeg at the DCT reduction on the CPU: mean absolute difference at
    most 2 of 255 on every clip of the first batches."""
    opt, record = prepared(tiny_synthetic, tmp_path, '--n_threads', '0')
    dataset, _ = data.get_validation_data(opt, dataclasses.replace(record, decode_on_device=True))
    gpu = device_jpeg_decoder(torch.device('cuda'))
    items = [dataset[i][0] for i in range(4)]
    assert all(isinstance(item, DeferredClip) for item in items)
    cpu_clips = BatchDecoder(dataset.spatial_transform, CpuJpeg())(DeferredBatch(items))
    gpu_clips = BatchDecoder(dataset.spatial_transform, gpu)(DeferredBatch(items))
    assert gpu_clips.is_cuda and gpu_clips.dtype == torch.uint8
    diff = (gpu_clips.cpu().int() - cpu_clips.int()).abs().float()
    assert diff.mean().item() <= 2.0, diff.mean().item()


def _deferred_items(opt, record, subset_builder, n=4):
    dataset, _ = subset_builder(opt, dataclasses.replace(record, decode_on_device=True))
    return dataset, DeferredBatch(dataset[i][0] for i in range(n))


def test_the_batched_full_size_decoder_path_on_the_cpu(tiny_synthetic, tmp_path):
    """The GPU decoders' batching (one call for the batch, split back per item,
    sizes checked, a failed batch searched for its corrupt frame) run with
    torchvision's decode_jpeg on the CPU: at full size (32x32 frames to 32) the
    worker path's clips exactly."""
    from datasets.device_jpeg import TorchvisionCudaJpeg
    opt, record = prepared(tiny_synthetic, tmp_path, '--n_threads', '0')
    dataset, items = _deferred_items(opt, record, data.get_validation_data)
    batched = TorchvisionCudaJpeg(torch.device('cpu'))
    assert batched.factors == ()
    got = BatchDecoder(dataset.spatial_transform, batched)(items)
    assert torch.equal(got, BatchDecoder(dataset.spatial_transform, CpuJpeg())(items))
    frames = items[1].frames
    broken = list(frames.frames())
    broken[2] = torch.tensor(list(b'not a jpeg'), dtype=torch.uint8)
    other = frames._replace(data=torch.cat(broken), ends=torch.cat(
        [torch.tensor([len(b) for b in broken])]).cumsum(0).tolist())
    with pytest.raises(DataError) as e:
        batched.decode([(items[0].frames, 1), (other, 1)])
    assert str(e.value).startswith(f'frame {frames.names[2]} of video {frames.video} is corrupt')
    small = frames._replace(frame_size=(16, 16))
    with pytest.raises(DataError) as e:
        batched.decode([(small, 1)])
    assert 'have different sizes' in str(e.value) and frames.names[0] in str(e.value)


def test_training_with_decoding_in_the_main_process_is_the_workers_training(
        tiny_synthetic, tmp_path, monkeypatch):
    """main.py with a loader worker, validation and inference, horizontal flips
    and colour jitter: decoding in the main process (what --decode_device cuda
    does, here with simplejpeg) trains to the same weights and scores as
    decoding in the worker."""
    import json
    runs = ('workers', 'main')
    for name in runs:
        if name == 'main':
            monkeypatch.setattr(data, 'decode_on_device', lambda opt, ctx: True)
        args = tiny_args(*tiny_synthetic, tmp_path / name, '--n_epochs', '1', '--inference',
                         '--colorjitter')
        main.main([a for a in args if a != '--no_hflip'])
    a, b = (torch.load(tmp_path / n / 'save_1.pth', weights_only=True)['state_dict'] for n in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = (json.loads((tmp_path / n / 'val.json').read_text())['results'] for n in runs)
    assert ra == rb
    run = json.loads((tmp_path / 'main' / 'opts.json').read_text())['run']
    assert run['decode_on_device'] is True


def _skipping_epoch(opt, record):
    """An epoch of the training loader over SkipBadVideos (main.py's
    --on_bad_video skip), and the wrapper (its bad-video record)."""
    from datasets.bad_videos import SkipBadVideos
    train, _ = data.get_training_data(opt, record)
    skipping = SkipBadVideos(train)
    loader = data.make_train_loader(skipping, opt, CPU)
    data.seed_worker_rngs(0)
    start_epoch(loader.loader, 1)
    return list(loader), skipping


def test_on_bad_video_skip_drops_a_frame_that_fails_to_decode_in_the_main_process(
        tiny_synthetic, tmp_path, capsys):
    """A training video whose 8th JPEG is garbage (in every clip, never the
    first frame, whose header the worker reads): the worker path replaces the
    sample by the next one, the main process's decoding drops it from its
    batch; both name it once in the same line and count it; every other clip
    and label is the worker path's."""
    import json
    import shutil
    video_path, annotation_path = tiny_synthetic
    copy = tmp_path / 'jpg'
    shutil.copytree(video_path, copy)
    database = json.loads(annotation_path.read_text())['database']
    bad = next(v for v, e in database.items() if e['subset'] == 'training')
    (copy / database[bad]['annotations']['label'] / bad / 'image_00008.jpg').write_bytes(
        b'not a jpeg at all')
    opt, record = prepared((copy, annotation_path), tmp_path, '--n_threads', '0',
                           '--on_bad_video', 'skip')
    workers, skipping = _skipping_epoch(opt, record)
    assert skipping.take_skipped() == 1
    worker_lines = capsys.readouterr().err.splitlines()
    deferred, skipping = _skipping_epoch(opt, dataclasses.replace(record, decode_on_device=True))
    assert skipping.take_skipped() == 1 and skipping.n_bad_videos == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == worker_lines and len(lines) == 1
    assert lines[0].startswith(f'skipping video {bad} (--on_bad_video skip): frame ')
    assert 'image_00008.jpg' in lines[0] and 'is corrupt' in lines[0]
    assert [len(y) for _, y in workers] == [8, 8, 8]
    assert sorted(len(y) for _, y in deferred) == [7, 8, 8]
    for (x, y), (x_d, y_d) in zip(workers, deferred):
        if len(y_d) == len(y):
            assert torch.equal(x, x_d) and torch.equal(y, y_d)
            continue
        replaced = [k for k in range(len(y)) if not any(torch.equal(x[k], c) for c in x_d)]
        assert len(replaced) == 1  # the bad sample's place (the next sample's clip there)
        others = [k for k in range(len(y)) if k != replaced[0]]
        assert torch.equal(x[others], x_d) and torch.equal(y[others], y_d)


def _broken(item):
    """The DeferredClip with its third frame's bytes replaced by garbage."""
    frames = list(item.frames.frames())
    frames[2] = torch.tensor(list(b'not a jpeg'), dtype=torch.uint8)
    ends = torch.tensor([len(f) for f in frames]).cumsum(0).tolist()
    return item._replace(frames=item.frames._replace(data=torch.cat(frames), ends=ends))


def test_batch_decoder_leaves_out_the_items_that_fail_and_stops_when_none_decodes(
        tiny_synthetic, tmp_path):
    class Record:  # SkipBadVideos' record_bad, kept
        def __init__(self):
            self.bad = []

        def record_bad(self, j, error):
            self.bad.append((j, error))

    opt, record = prepared(tiny_synthetic, tmp_path, '--n_threads', '0')
    dataset, items = _deferred_items(opt, record, data.get_validation_data)
    record_bad = Record()
    decoder = BatchDecoder(dataset.spatial_transform, CpuJpeg(), record_bad)
    assert decoder.decode(items)[1] is None
    mixed = DeferredBatch([items[0], _broken(items[1]), items[2], items[3]])
    clips, kept = decoder.decode(mixed)
    assert kept == [0, 2, 3] and torch.equal(clips, decoder(items)[kept])
    assert [j for j, _ in record_bad.bad] == [items[1].record] and 'is corrupt' in record_bad.bad[0][1]
    with pytest.raises(DataError) as e:
        decoder.decode(DeferredBatch(_broken(item) for item in items))
    assert str(e.value).startswith('every video of a batch of 4 failed to decode (--on_bad_video '
                                   'skip), the first: frame ') and '\n' not in str(e.value)
    with pytest.raises(DataError):  # without --on_bad_video skip: the run's error
        BatchDecoder(dataset.spatial_transform, CpuJpeg()).decode(mixed)
