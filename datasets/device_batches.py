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
wait_stream and record_stream for the same guarantees).

With --decode_device cuda the workers hand over a DeferredBatch instead (each
item's JPEG bytes and the crop box its spatial transform planned,
datasets/loader.py): ToDevice decodes it first (BatchDecoder: one decoder
call for the whole batch, datasets/device_jpeg.py), crops, resizes and
augments each item there with the workers' own code and random stream, then
normalizes as above. With --on_bad_video skip an item whose frames fail to
decode there is left out of the batch (its target too).
"""
import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from datasets.loader import DeferredBatch
from datasets.videodataset import make_clips
from utils.errors import DataError


def _continued(rng_state):
    """The CPU generator (where v2 transforms draw their parameters) at the
    state the item's worker left it in after planning the crop, and restored
    after; nothing when the item draws nothing more."""
    if rng_state is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=[]))
    torch.default_generator.set_state(torch.frombuffer(bytearray(rng_state), dtype=torch.uint8))
    return stack


class BatchDecoder:
    """DeferredBatch -> the uint8 clips the workers would have handed over,
    (B, [views,] T, C, H, W), on `jpeg`'s device: the batch's frames decoded in
    one call (at the DCT reduction each item's plan allows, where the decoder
    has reductions), then each item cropped, resized and augmented as
    `spatial` (the data set's transform, normalization deferred) does in a
    worker, its random steps continuing its worker's random stream.

    bad_videos: the training set's SkipBadVideos (--on_bad_video skip): an
    item whose frames fail to decode is left out of the batch (decode), its
    video reported and counted there as a worker's bad sample is."""

    def __init__(self, spatial, jpeg, bad_videos=None):
        self.spatial, self.jpeg, self.bad_videos = spatial, jpeg, bad_videos

    def __call__(self, batch: DeferredBatch) -> torch.Tensor:
        """Every item's clips; a frame that fails to decode raises DataError."""
        factors = self._factors(batch)
        decoded = self.jpeg.decode([(item.frames, f) for item, f in zip(batch, factors)])
        return self._clips(batch, factors, decoded)

    def decode(self, batch: DeferredBatch):
        """(the clips of the items that decode, the indices of those items in
        the batch, or None when they all do)."""
        try:
            return self(batch), None
        except DataError:
            if self.bad_videos is None:
                raise
        # a batch decoder fails as a whole: each item alone, to find the bad ones
        factors, kept, decoded, first_error = self._factors(batch), [], [], None
        for k, (item, factor) in enumerate(zip(batch, factors)):
            try:
                decoded.append(self.jpeg.decode([(item.frames, factor)])[0])
            except DataError as e:
                first_error = first_error or str(e)
                self.bad_videos.record_bad(item.record, str(e))
                continue
            kept.append(k)
        if not kept:
            raise DataError(f'every video of a batch of {len(batch)} failed to decode '
                            f'(--on_bad_video skip), the first: {first_error}')
        batch = [batch[k] for k in kept]
        return self._clips(batch, [factors[k] for k in kept], decoded), kept

    def _factors(self, batch):
        return [1 if item.plan is None else item.plan.reduction(self.jpeg.factors)
                for item in batch]

    def _clips(self, batch, factors, decoded) -> torch.Tensor:
        clips = []
        for item, factor, frames in zip(batch, factors, decoded):
            with _continued(item.rng_state):
                clips.append(make_clips(frames, item.union, item.clips, self.spatial,
                                         item.multi, item.plan, factor))
        return torch.stack(clips)


def _take(field, kept):
    """A collated batch field (a tensor, or a tuple/list of them) at the items `kept`."""
    if isinstance(field, torch.Tensor):
        return field[torch.tensor(kept, device=field.device)]
    if isinstance(field, (tuple, list)):
        return type(field)(_take(f, kept) for f in field)
    raise TypeError(f'cannot leave items out of a batch field of type {type(field).__name__}')


@dataclass(frozen=True)
class ToDevice:
    """How the clips of a batch become the model's input on `device`.
    normalizer: uint8 (N, T, C, H, W) -> float (N, C, T, H, W) in a given
    memory_format (datasets.spatial_transforms.NormalizeToInput), or None when
    the clips come normalized. decoder: decodes the DeferredBatches of
    --decode_device cuda (their clips come out uint8: a normalizer is needed)."""
    device: torch.device
    normalizer: Callable | None = None
    channels_last: bool = False
    decoder: BatchDecoder | None = None  # --decode_device cuda: DeferredBatches

    def clips(self, clips):
        """(..., 4 dims per clip) clips -> (N, C, T, H, W) float on the device."""
        if isinstance(clips, DeferredBatch):
            clips = self.decoder(clips)  # uint8, on the device already
        clips = clips.flatten(0, clips.dim() - 5)  # a view: (B, K, ...) -> (B * K, ...)
        clips = clips.to(self.device, non_blocking=True)
        layout = torch.channels_last_3d if self.channels_last else torch.contiguous_format
        if self.normalizer is not None:
            return self.normalizer(clips, memory_format=layout)  # one copy, straight into the layout
        return clips.contiguous(memory_format=layout)

    def batch(self, clips, rest):
        """(the clips through clips(), the batch's other fields); with --on_bad_video
        skip an item whose frames fail to decode here is left out of both."""
        if isinstance(clips, DeferredBatch):
            clips, kept = self.decoder.decode(clips)
            if kept is not None:
                rest = [_take(field, kept) for field in rest]
        return self.clips(clips), rest

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
            clips, rest = self.to_device.batch(clips, rest)
            if self.with_targets:
                rest[0] = self.to_device.targets(rest[0])
            yield clips, *rest
