"""Map-style data sets over :class:`~datasets.annotation.VideoRecord` lists.

An item decodes the union of the frame positions it needs once (one loader
call), augments the decoded uint8 frames once (one set of random parameters
per item) and only then indexes the clips out of it and converts to float.

With a loader that can read a clip before decoding it (``loader.read``: the
JPEG loaders, and the video loader, whose frames FFmpeg's scaler converts to
RGB at the reduced size) the spatial transform plans its crop from the frame
size first and the frames are decoded at the largest reduction (1/2, 1/4, 1/8)
that still gives the crop at least the output size (see datasets/spatial_transforms.py);
the random draws are the same, in the same order, as with full-size decoding.
"""
from __future__ import annotations

import functools
from itertools import chain
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

from datasets.annotation import VideoRecord
from datasets.loader import DeferredBatch, DeferredClip
from datasets.spatial_transforms import ClipTransform
from utils.errors import DataError, StorageError

__all__ = ['VideoClipDataset', 'VideoWindowDataset', 'BadVideo', 'collate', 'make_clips']


class BadVideo(NamedTuple):
    """A DataError met in a loader worker, handed back as a value (see dataset.py's
    VideoDataLoader, which raises it in the main process); ``storage``: a
    StorageError (the shards could not be fetched), which --on_bad_video skip
    never skips."""
    message: str
    storage: bool = False


def _errors_as_values(get_item):
    @functools.wraps(get_item)
    def wrapper(self, i):
        try:
            return get_item(self, i)
        except (DataError, StorageError) as e:
            if get_worker_info() is None:  # main process: raise as usual
                raise
            return BadVideo(str(e), isinstance(e, StorageError))
    return wrapper


def collate(items):
    """default_collate, or the first BadVideo among the items; DeferredClips
    (decoded later, on the device) are gathered in a DeferredBatch."""
    bad = next((item for item in items if isinstance(item, BadVideo)), None)
    if bad is not None:
        return bad
    if isinstance(items[0], (tuple, list)) and isinstance(items[0][0], DeferredClip):
        return [DeferredBatch(item[0] for item in items),
                *default_collate([item[1:] for item in items])]
    return default_collate(items)


def _guarded(record: VideoRecord, fn, *args):
    """fn(*args), its errors as DataErrors that name the video."""
    try:
        return fn(*args)
    except DataError as e:
        if record.video_id in str(e):
            raise
        raise DataError(f'{e} [video {record.video_id}]') from None
    except StorageError:  # the network, not the video: never a DataError
        raise
    except (OSError, RuntimeError) as e:
        raise DataError(f'loading video {record.video_id} ({record.path}) failed: {e}; '
                        f're-extract its frames') from e


def _load(loader, record: VideoRecord, positions: list[int]) -> torch.Tensor:
    return _guarded(record, loader, record.path, positions)


def _one_draw(spatial, multi: bool) -> bool:
    """Whether the item's frames get one augmentation draw (not one per clip)."""
    return isinstance(spatial, ClipTransform) and (spatial.deterministic or not multi)


def _decode(loader, record: VideoRecord, union: list[int], spatial, multi: bool):
    """(frames of ``union`` uint8 (U, C, h, w), plan, factor): decoded at 1/factor
    of their stored size for the spatial transform's plan of this item, when
    the loader can read before decoding; else at full size (plan None, factor 1)."""
    if not (_one_draw(spatial, multi) and hasattr(loader, 'read')):
        return _load(loader, record, union), None, 1
    encoded = _guarded(record, loader.read, record.path, union)
    plan = spatial.plan(_guarded(record, lambda: encoded.frame_size))
    factor = 1 if plan is None else plan.reduction(encoded.factors)
    return _guarded(record, encoded.decode, factor), plan, factor


def _deferred(loader, record: VideoRecord, index: int, union: list[int], clips, spatial,
              multi: bool) -> DeferredClip:
    """The item's frames read, not decoded, with the spatial transform's plan
    for them (drawn here, as _decode draws it) and the CPU generator's state
    after it: the rest of its random steps (flip, colour jitter, RandAugment,
    erasing) run where the frames are decoded (datasets/device_batches.py) and
    continue from that state, so they draw what they draw in a worker."""
    if not _one_draw(spatial, multi):
        raise ValueError('decoding on the device needs one augmentation draw per item')
    encoded = _guarded(record, loader.read, record.path, union)
    plan = spatial.plan(_guarded(record, lambda: encoded.frame_size))
    # bytes, not a tensor: pickled with the item, not one more shared-memory segment
    state = None if spatial.deterministic else torch.default_generator.get_state().numpy().tobytes()
    return DeferredClip(encoded.pack(), plan, union, [list(c) for c in clips], multi, state,
                        index)


def make_clips(frames: torch.Tensor, union: list[int], clips: Sequence[Sequence[int]],
                spatial: Callable | None, multi: bool, plan=None, factor: int = 1) -> torch.Tensor:
    """Cut ``clips`` (lists of positions) out of ``frames`` (decoded ``union``,
    uint8 (U, C, H, W), at 1/factor for ``plan``) and transform them ->
    (C, T, H, W) or (N, C, T, H, W)."""
    where = {p: i for i, p in enumerate(union)}
    flat = [where[p] for p in chain.from_iterable(clips)]
    n, t = len(clips), len(clips[0])
    identity = flat == list(range(len(union)))
    if getattr(spatial, 'n_crops', 1) > 1:
        return _make_crops(frames, flat, n, spatial, multi, plan, factor)
    if _one_draw(spatial, multi):
        # one augmentation draw for the item, applied to the distinct frames once
        aug = spatial.augment(frames, plan, factor)
        sel = aug if identity else aug[torch.tensor(flat)]
        out = spatial.finish(sel.reshape(n, t, *sel.shape[1:]))  # (N, C, T, H, W)
        return out if multi else out[0]
    per_clip = []
    for k in range(n):
        idx = torch.tensor(flat[k * t:(k + 1) * t])
        clip = frames[idx]
        per_clip.append(spatial(clip) if spatial is not None else clip.movedim(1, 0))
    return torch.stack(per_clip) if multi else per_clip[0]


def _make_crops(frames, flat, n, spatial, multi, plan, factor):
    """Several spatial views a clip (ThreeCropTransform): the distinct frames are
    resized once -> (K, U, C, h, w); -> (N, K, C, T, h, w) or (K, C, T, h, w)."""
    aug = spatial.augment(frames, plan, factor)
    k = aug.shape[0]
    sel = aug[:, torch.tensor(flat)]  # (K, N * T, C, h, w)
    sel = sel.reshape(k, n, -1, *sel.shape[2:]).transpose(0, 1)
    out = spatial.finish(sel)
    return out if multi else out[0]


class VideoClipDataset(Dataset):
    """One item per record: ``(clip, label)``.

    ``temporal_transform(positions)`` returns one clip (list of positions) ->
    clip float (C, T, H, W), or a list of clips (e.g. TemporalEvenCrop for
    validation) -> clips float (N, C, T, H, W), all with the same spatial
    transform (an eval transform is applied once to the union of the
    frames).  ``temporal_transform=None`` uses every frame; ``spatial_transform=None``
    returns the uint8 clip permuted to (C, T, H, W).
    """

    def __init__(self, records: Sequence[VideoRecord], loader: Callable,
                 temporal_transform: Callable | None = None,
                 spatial_transform: Callable | None = None):
        self.records = records
        self.loader = loader
        self.temporal_transform = temporal_transform
        self.spatial_transform = spatial_transform

    def __len__(self) -> int:
        return len(self.records)

    @property
    def labels(self) -> np.ndarray:
        if hasattr(self.records, 'label'):  # a RecordTable: no per-record objects
            return self.records.label.astype(np.int64)
        return np.fromiter((r.label for r in self.records), dtype=np.int64,
                           count=len(self.records))

    @_errors_as_values
    def __getitem__(self, i: int):
        record = self.records[i]
        frames = record.positions
        sel = self.temporal_transform(frames) if self.temporal_transform is not None \
            else list(frames)
        multi = isinstance(sel[0], (list, tuple, range))
        clips = sel if multi else [sel]
        union = sorted(set(chain.from_iterable(clips)))
        if getattr(self.loader, 'defer_decoding', False):
            return _deferred(self.loader, record, i, union, clips, self.spatial_transform,
                             multi), record.label
        decoded, plan, factor = _decode(self.loader, record, union, self.spatial_transform, multi)
        return make_clips(decoded, union, clips, self.spatial_transform, multi, plan, factor), \
            record.label


class VideoWindowDataset(Dataset):
    """Inference: one item per (video, sliding window) ->
    ``(clip (C, T, H, W), video_index, (seg_begin, seg_end))`` -- the clip is
    ``(K, C, T, H, W)`` with a K-view spatial transform (three crops) -- where the segment
    is the half-open range of frames the window covers (clipped at the video's
    end) in the annotation's numbering (1-based for jpg-built files).

    Windows of a video are contiguous in index order; ``video_of_item[i]`` is
    the record index of item ``i`` (numpy int64), so videos can be sharded
    over ranks by contiguous item ranges (:meth:`shard`).
    """

    def __init__(self, records: Sequence[VideoRecord], loader: Callable, sliding_window,
                 spatial_transform: Callable | None = None):
        self.records = records
        self.loader = loader
        self.sliding_window = sliding_window
        self.spatial_transform = spatial_transform
        n_frames = records.n_frames.astype(np.int64) if hasattr(records, 'n_frames') else \
            np.fromiter((r.n_frames for r in records), dtype=np.int64, count=len(records))
        if hasattr(sliding_window, 'span') and hasattr(sliding_window, 'window_stride'):
            room = np.maximum(0, n_frames - sliding_window.span)
            stride = sliding_window.window_stride
            n_windows = 1 + (room + stride - 1) // stride
        else:
            n_windows = np.array([sliding_window.n_windows(int(n)) for n in n_frames],
                                 dtype=np.int64)
        self.n_windows = n_windows
        self.video_offsets = np.concatenate([[0], np.cumsum(n_windows)]).astype(np.int64)
        self.video_of_item = np.repeat(np.arange(len(records), dtype=np.int64), n_windows)
        self.window_of_item = (np.arange(int(self.video_offsets[-1]), dtype=np.int64)
                               - np.repeat(self.video_offsets[:-1], n_windows))

    def __len__(self) -> int:
        return int(self.video_offsets[-1])

    def shard(self, rank: int, world_size: int) -> range:
        """Contiguous item range of ``rank``: whole videos, about equal item counts.
        The records of one video id (ActivityNet's segments, listed together) stay
        on one rank, whose inference averages them into the video's score."""
        total = len(self)
        starts = self._video_id_starts()
        bounds = [0]
        for r in range(1, world_size):
            target = total * r // world_size
            v = int(np.searchsorted(starts, target, side='left'))
            bounds.append(int(starts[min(v, len(starts) - 1)]))
        bounds.append(total)
        bounds = np.maximum.accumulate(bounds)
        return range(int(bounds[rank]), int(bounds[rank + 1]))

    def _video_id_starts(self) -> np.ndarray:
        """Item offsets where a run of records with one video id begins, and the total."""
        n = len(self.records)
        video_id = getattr(self.records, 'video_id', None)  # a RecordTable: no VideoRecords
        ids = [video_id(i) for i in range(n)] if callable(video_id) else \
            [r.video_id for r in self.records]
        first = [i for i in range(n) if i == 0 or ids[i] != ids[i - 1]]
        return np.append(self.video_offsets[first], self.video_offsets[-1])

    @_errors_as_values
    def __getitem__(self, i: int):
        v = int(self.video_of_item[i])
        k = int(self.window_of_item[i])
        record = self.records[v]
        sw = self.sliding_window
        positions = sw.window(record.positions, k)
        union = sorted(set(positions))
        if getattr(self.loader, 'defer_decoding', False):
            clip = _deferred(self.loader, record, v, union, [positions],
                             self.spatial_transform, False)
        else:
            decoded, plan, factor = _decode(self.loader, record, union, self.spatial_transform,
                                            False)
            clip = make_clips(decoded, union, [positions], self.spatial_transform, False, plan,
                               factor)
        start = sw.start(record.n_frames, k)
        end = min(start + sw.span, record.n_frames)
        first_number = record.segment[0]  # annotation's number of position first_frame
        return clip, v, (start + first_number, end + first_number)
