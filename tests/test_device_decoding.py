"""--decode_device cuda: the loader workers read the JPEG bytes and plan the crop,
the main process decodes the batch where the batch goes, then crops, resizes,
augments and normalizes there. On the CPU the same code decodes with
simplejpeg at the workers' DCT reduction: its clips equal the worker path's."""
import dataclasses

import pytest
import torch

import dataset as data
import main
from datasets.device_jpeg import CpuJpeg, device_jpeg_decoder
from datasets.loader import DeferredBatch, DeferredClip
from opts import parse_opts
from tests.conftest import tiny_args
from tests.test_datasets import parsed, prepared
from utils.device_batches import BatchDecoder
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


def test_random_steps_run_where_the_frames_are_decoded(tiny_synthetic, tmp_path):
    """With horizontal flips (the tiny runs have --no_hflip) each clip is the
    same crop as without, flipped or not by the seed its worker drew; both happen."""
    opt, record = prepared(tiny_synthetic, tmp_path, '--n_threads', '0')
    plain = first_batches(opt, dataclasses.replace(record, decode_on_device=True), 'train', 3)
    args = [a for a in tiny_args(*tiny_synthetic, tmp_path / 'h') if a != '--no_hflip']
    opt_h = parse_opts(args + ['--n_threads', '0'])
    record_h, _ = main.prepare(opt_h, CPU)
    hflip = first_batches(opt_h, dataclasses.replace(record_h, decode_on_device=True), 'train', 3)
    flipped = []
    for (x, _), (y, _) in zip(plain, hflip):
        for a, b in zip(x, y):
            same, mirrored = torch.equal(a, b), torch.equal(a.flip(-1), b)
            assert same or mirrored
            flipped.append(mirrored and not same)
    assert any(flipped) and not all(flipped)


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
    """main.py with a loader worker, validation and inference: decoding in the
    main process (what --decode_device cuda does, here with simplejpeg) trains
    to the same weights and scores as decoding in the worker."""
    import json
    runs = ('workers', 'main')
    for name in runs:
        if name == 'main':
            monkeypatch.setattr(data, 'decode_on_device', lambda opt, ctx: True)
        main.main(tiny_args(*tiny_synthetic, tmp_path / name, '--n_epochs', '1', '--inference'))
    a, b = (torch.load(tmp_path / n / 'save_1.pth', weights_only=True)['state_dict'] for n in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = (json.loads((tmp_path / n / 'val.json').read_text())['results'] for n in runs)
    assert ra == rb
    run = json.loads((tmp_path / 'main' / 'opts.json').read_text())['run']
    assert run['decode_on_device'] is True
