"""The clips `util_scripts.export --quantize int8` calibrates on and compares
on: a few hundred clips of an annotation's training videos (calibration), and
the clips of its validation videos (the int8 file's top-1 agreement with fp32,
the video accuracy of both). They are read as validation and predict.py read
them, with the checkpoint's input settings: the clip loader of its file type,
dataset.eval_views' center crop and normalization: the input the exported
model expects. The videos are a folder's (of the checkpoint's --file_type), or
the shards util_scripts.make_shards wrote (a folder with its index.json, an
http(s):// or s3:// URL), read through their ShardStore as training reads them,
their file type the index's."""
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import dataset as data
from datasets.annotation import load_annotations, read_annotation
from datasets.frame_check import check_videos
from datasets.storage import ShardStore, open_shards
from datasets.synthetic import synthetic_paths
from datasets.videodataset import VideoClipDataset
from utils.errors import DataError, OptionError
from utils.urls import redacted

BATCH = 8  # clips per forward pass, calibration and comparison alike


@dataclass
class ClipSet:
    """Videos and how many clips of each (spread evenly over the video), at
    most ``limit`` clips in all; ``labels``: each video's class as the model's
    output index (-1: none); ``file_type`` (None: the options') and ``store``:
    how the records' videos are read (a ShardStore: their paths are REL keys)."""
    records: list
    clips_per_video: int
    labels: list
    limit: int | None = None
    file_type: str | None = None
    store: ShardStore | None = None

    @property
    def n_clips(self):
        total = len(self.records) * self.clips_per_video
        return total if self.limit is None else min(total, self.limit)

    def batches(self, options):
        """(clips float32 (b, C, T, H, W), video index of each clip) of BATCH clips."""
        temporal, spatial = data.eval_views(options, self.clips_per_video, 0, 'center')
        loader = data.clip_loader(self.file_type or options.file_type, options.input_type, store=self.store)
        videos = VideoClipDataset(self.records, loader, temporal, spatial)
        clips, owners, taken = [], [], 0
        for v in range(len(videos)):
            for clip in videos[v][0][:self.n_clips - taken]:
                clips.append(clip.numpy())
                owners.append(v)
                taken += 1
            while len(clips) >= BATCH or (clips and (v == len(videos) - 1 or taken == self.n_clips)):
                yield np.stack(clips[:BATCH]), np.array(owners[:BATCH])
                clips, owners = clips[BATCH:], owners[BATCH:]
            if taken == self.n_clips:
                return


def video_root(video_path, options, checkpoint, storage_options=None):
    """--video_path, else the folder the checkpoint's run read its videos from (with
    the run's --storage_options unless ``storage_options`` are given): a Path, or
    the ShardStore of make_shards' output there (a folder with its index, a URL)."""
    path = video_path if video_path is not None else options.video_path
    if video_path is None and options.dataset == 'synthetic':  # its video_path is the set's root
        path = synthetic_paths(data.synthetic_root(options))[0]
    if path is None:
        raise OptionError(f'{checkpoint} stores no video_path: give --video_path, the folder of '
                          f'the --calibration annotation\'s videos')
    origin = '--video_path' if video_path is not None else f'the video_path of {checkpoint}'
    if video_path is None and redacted(path):
        raise OptionError(f'{checkpoint} keeps its run\'s video_path without its credentials ({path}): '
                          f'give --video_path')
    if storage_options is None and video_path is None and options.dataset != 'synthetic':
        storage_options = getattr(options, 'storage_options', None)
    store = _shards_at(path, origin, storage_options)
    if store is not None:
        return store
    if not Path(path).is_dir():
        raise DataError(f'{path} ({origin}) is not a folder: give --video_path, the folder of the '
                        f'--calibration annotation\'s videos (as --file_type {options.file_type})')
    return Path(path)


def _shards_at(path, origin, storage_options):
    """The ShardStore of make_shards' output at ``path`` (its index read), or None."""
    try:
        return open_shards(path, storage_options)
    except OptionError as e:  # a protocol fsspec does not know, or its package missing
        raise OptionError(f'{e} ({origin})') from None


def _subset(annotation_path, subset, root, options):
    """(records, the annotation's class names, file type, ShardStore or None) of a subset,
    its videos checked on disk or in the shard index. ``root``: a folder or a ShardStore."""
    read_annotation(annotation_path, check='--calibration')
    store = root if isinstance(root, ShardStore) else None
    if store is None:
        file_type = options.file_type
        records, names = load_annotations(annotation_path, subset, root, options.dataset, file_type=file_type)
    else:  # REL keys (<label>/<video_id>) and the index's counts, as training reads shards
        file_type = store.index().file_type
        records, names = load_annotations(annotation_path, subset, '', options.dataset, file_type='jpg',
                                          count=store.index().n_frames)
    check_videos(records, file_type, input_type=options.input_type, store=store)
    return records, names, file_type, store


def calibration_set(annotation_path, root, options, n_clips):
    """``n_clips`` clips of the subset's training videos: videos evenly spaced
    in the annotation's order, as many clips from each as it takes."""
    records, _, file_type, store = _subset(annotation_path, 'training', root, options)
    n_videos = min(len(records), n_clips)
    picks = np.linspace(0, len(records) - 1, n_videos).round().astype(int)  # distinct
    chosen = [records[i] for i in picks]
    return ClipSet(chosen, math.ceil(n_clips / n_videos), [r.label for r in chosen], n_clips, file_type, store)


def validation_set(annotation_path, root, options, class_names):
    """Every validation video, its --n_val_samples clips as validation takes
    them; labels mapped to the checkpoint's class order."""
    records, names, file_type, store = _subset(annotation_path, 'validation', root, options)
    index = {name: i for i, name in enumerate(class_names)}
    unknown = sorted({names[r.label] for r in records if r.label >= 0} - set(index))
    if unknown:
        raise DataError(f'--calibration {annotation_path}: its validation labels {unknown[:3]} are '
                        f'not classes of the checkpoint: give the annotation it was trained on')
    labels = [index[names[r.label]] if r.label >= 0 else -1 for r in records]
    return ClipSet(records, options.n_val_samples, labels, file_type=file_type, store=store)
