"""Batches to the device (datasets/device_batches.py): the copy is asynchronous and
comes first, normalization and layout happen on the device, targets follow,
the loader builders put pinned memory under it on a GPU. Without a GPU the
device is 'meta' (tensors with a device, a dtype and a layout, no data)."""
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader

import dataset as data
from datasets.device_batches import DeviceLoader, ToDevice
from datasets.spatial_transforms import NormalizeToInput
from tests.test_datasets import prepared
from utils.distributed import DistContext

META = torch.device('meta')


class TensorCalls(TorchFunctionMode):
    """Every torch call: (name, [(device type, dtype) of its tensor arguments],
    its other positional arguments, its keyword arguments)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [(a.device.type, a.dtype) for a in args if isinstance(a, torch.Tensor)]
        others = [a for a in args if not isinstance(a, torch.Tensor)]
        self.calls.append((getattr(func, '__name__', str(func)), tensors, others, kwargs))
        return func(*args, **kwargs)


def _norm():
    return NormalizeToInput([0.4, 0.5, 0.6], [0.2, 0.25, 0.3], value_scale=1)


def test_uint8_clips_are_copied_first_then_normalized_on_the_device_into_the_layout():
    to_device = ToDevice(META, _norm(), channels_last=True)
    views = torch.randint(0, 256, (2, 3, 4, 3, 8, 8), dtype=torch.uint8)  # (B, K, T, C, H, W)
    with TensorCalls() as log:
        out = to_device.clips(views)
    assert out.device == META and out.dtype == torch.float32 and out.shape == (6, 3, 4, 8, 8)
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    on_host = [c for c in log.calls if ('cpu', torch.uint8) in c[1]]
    copies = [c for c in on_host if c[0] == 'to']
    assert len(copies) == 1 and copies[0][2] == [META] and copies[0][3] == {'non_blocking': True}
    assert {c[0] for c in on_host} <= {'dim', 'flatten', 'to'}  # nothing else touches host data
    arithmetic = [c for c in log.calls if c[0] in ('mul_', 'sub_', 'mul', 'sub', 'div')]
    assert [c[0] for c in arithmetic] == ['mul_', 'sub_']
    assert all(device == 'meta' for c in arithmetic for device, _ in c[1])
    # The normalization constants reach the device once, not with every batch.
    with TensorCalls() as again:
        to_device.clips(views)
    assert not [c for c in again.calls if c[0] == 'to' and ('cpu', torch.float32) in c[1]]


def test_float_clips_are_copied_and_laid_out():
    clips = torch.randn(2, 3, 4, 8, 8)
    plain = ToDevice(META).clips(clips)
    last = ToDevice(META, channels_last=True).clips(clips)
    assert plain.device == last.device == META and plain.shape == last.shape == (2, 3, 4, 8, 8)
    assert plain.is_contiguous() and last.is_contiguous(memory_format=torch.channels_last_3d)
    # On the CPU 'device': the values as they were (nothing to copy).
    assert torch.equal(ToDevice(torch.device('cpu'), channels_last=True).clips(clips), clips)


def test_device_loader_moves_clips_and_targets_and_keeps_the_rest_on_the_host():
    batches = [(torch.randn(2, 3, 3, 4, 8, 8), torch.tensor([0, 1]), torch.tensor([5, 6]))]
    labelled = next(iter(DeviceLoader(batches, ToDevice(META), with_targets=True)))
    assert labelled[0].shape == (6, 3, 4, 8, 8) and labelled[0].device == META
    assert labelled[1].device == META and labelled[2].device.type == 'cpu'
    views = next(iter(DeviceLoader(batches, ToDevice(META))))  # inference: indices stay
    assert views[1].device.type == 'cpu' and views[1].tolist() == [0, 1]
    loader = DataLoader(list(range(5)), batch_size=2)
    assert len(DeviceLoader(loader, ToDevice(META))) == 3
    assert DeviceLoader(loader, ToDevice(META)).dataset is loader.dataset


@pytest.mark.parametrize('mode', ['on', 'off'])
def test_loaders_for_a_gpu_pin_memory_and_normalize_there_when_asked(tiny_synthetic, tmp_path, mode):
    """Built for a CUDA process (not run: the loaders only record it)."""
    opt, record = prepared(tiny_synthetic, tmp_path, '--normalize_on_device', mode,
                           '--channels_last')
    gpu = DistContext(device=torch.device('cuda', 0))
    sets = (data.get_training_data(opt, record)[0], data.get_validation_data(opt, record)[0],
            data.get_inference_data(opt, record)[0])
    makers = (data.make_train_loader, data.make_val_loader, data.make_inference_loader)
    for dataset, make in zip(sets, makers):
        loader = make(dataset, opt, gpu)
        assert loader.loader.pin_memory and loader.to_device.device == gpu.device
        assert loader.to_device.channels_last
        normalizer = loader.to_device.normalizer
        assert (normalizer is dataset.spatial_transform.device_normalizer) and \
            ((normalizer is None) == (mode == 'off'))
    assert [m(s, opt, gpu).with_targets for s, m in zip(sets, makers)] == [True, True, False]
    cpu_loader = data.make_val_loader(sets[1], opt, DistContext())
    assert not cpu_loader.loader.pin_memory


@pytest.mark.gpu
def test_pinned_uint8_batches_normalized_on_the_gpu_equal_the_cpus():
    norm = _norm()
    clips = torch.randint(0, 256, (4, 2, 8, 3, 16, 16), dtype=torch.uint8)
    loader = DataLoader(list(zip(clips, range(4))), batch_size=2, pin_memory=True)
    gpu = ToDevice(torch.device('cuda'), norm, channels_last=True)
    for (x, y), (cx, _) in zip(DeviceLoader(loader, gpu, with_targets=True),
                               DataLoader(list(zip(clips, range(4))), batch_size=2)):
        assert x.is_cuda and y.is_cuda and x.is_contiguous(memory_format=torch.channels_last_3d)
        assert torch.equal(x.cpu(), ToDevice(torch.device('cpu'), norm).clips(cx))
