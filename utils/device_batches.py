"""Batches to the device: what the training loop, precise BN, validation,
inference and predict.py iterate (the role timm's PrefetchLoader plays).

A DataLoader's workers hand over clips as the spatial transform left them:
normalized float (N, C, T, H, W), or uint8 (N, T, C, H, W) when the transform
deferred its normalization (--normalize_on_device: 4x fewer bytes through
shared memory, pinned memory and PCIe). On a GPU the DataLoader puts each
batch in pinned memory (pin_memory=True), so the copy below is asynchronous.

DeviceLoader yields each batch with its clips as the model's input on the
device (ToDevice.clips): the views of an item (validation's clips of a video,
inference's crops) flattened into the batch, copied with non_blocking=True,
normalized there, in channels_last_3d with --channels_last. Everything runs
on the current stream: the copy, the normalization and the forward pass are
queued in that order, the host never waits, and a buffer is not reused while
a copy into it is in flight (timm prefetches on a side stream, which needs
wait_stream and record_stream for the same guarantees). A step that decodes
on the device (workers handing over encoded frames and their crop boxes)
belongs in ToDevice.clips too, before the normalization.
"""
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class ToDevice:
    """How the clips of a batch become the model's input on `device`.
    normalizer: uint8 (N, T, C, H, W) -> float (N, C, T, H, W) in a given
    memory_format (datasets.spatial_transforms.NormalizeToInput), or None when
    the clips come normalized."""
    device: torch.device
    normalizer: Callable | None = None
    channels_last: bool = False

    def clips(self, clips):
        """(..., 4 dims per clip) clips -> (N, C, T, H, W) float on the device."""
        clips = clips.flatten(0, clips.dim() - 5)  # a view: (B, K, ...) -> (B * K, ...)
        clips = clips.to(self.device, non_blocking=True)
        layout = torch.channels_last_3d if self.channels_last else torch.contiguous_format
        if self.normalizer is not None:
            return self.normalizer(clips, memory_format=layout)  # one copy, straight into the layout
        return clips.contiguous(memory_format=layout)

    def targets(self, targets):
        return targets.to(self.device, non_blocking=True)


class DeviceLoader:
    """Iterates `loader` (a DataLoader, or any iterable of batches) with each
    batch's clips (its first field) through to_device.clips and, with
    with_targets, its targets (the second field) on the device too; the other
    fields (video indices, segments) stay on the host.

    `loader` is the DataLoader itself, for what its sampler and data set
    decide (utils.resumable_data.start_epoch); `dataset` is its data set."""

    def __init__(self, loader, to_device, with_targets=False):
        self.loader = loader
        self.to_device = to_device
        self.with_targets = with_targets

    @property
    def dataset(self):
        return self.loader.dataset

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for clips, *rest in self.loader:
            clips = self.to_device.clips(clips)
            if self.with_targets:
                rest[0] = self.to_device.targets(rest[0])
            yield clips, *rest
