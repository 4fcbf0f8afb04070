"""Builds the training, validation and inference data sets and their loaders.

Where a clip comes from, in order:
  annotation JSON -> VideoRecord (datasets/annotation.py)
  temporal transform picks frame positions (datasets/temporal_transforms.py)
  loader reads and decodes those frames at once (datasets/loader.py)
  spatial transform crops/flips/resizes the whole uint8 clip, then normalizes
  (datasets/spatial_transforms.py)
  DataLoader batches clips (C, T, H, W) -> (N, C, T, H, W); its DeviceLoader
  copies them to the device (normalized there with --normalize_on_device,
  datasets/device_batches.py) for the model.
"""
import datetime
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from datasets.annotation import SUBSET_NAMES
from datasets.bad_videos import SkipBadVideos
from datasets.device_batches import BatchDecoder, DeviceLoader, ToDevice
from datasets.device_jpeg import device_jpeg_decoder
from datasets.frame_check import check_videos, count_short_videos, default_cache_dir
from datasets.loader import make_loader
from datasets.samplers import ShardSampler
from datasets.spatial_transforms import build_eval_transform, build_train_transform, get_mean_std
from datasets.storage import open_shards
from datasets.synthetic import prepare_synthetic
from datasets.temporal_transforms import (
    SlidingWindow,
    TemporalCenterCrop,
    TemporalEvenCrop,
    TemporalRandomCrop,
)
from datasets.video_index import FrameTable, load_record_table
from datasets.videodataset import BadVideo, VideoClipDataset, VideoWindowDataset, collate
from utils.distributed import barrier
from utils.errors import USER_ERRORS, DataError, OptionError, StorageError
from utils.preemption import shield_loader_worker, stop_signals_blocked
from utils.resumable_data import ResumableSampler, SeededSamples, seed_everything
from utils.urls import redact_url

DEFAULT_SYNTHETIC_ROOT = Path('data') / 'synthetic'
INDEX_CACHE_DIR = 'data_index'
CHECK_WAIT = datetime.timedelta(hours=24)  # ranks waiting for their node's frame check


def synthetic_root(opt):
    """Where --dataset synthetic keeps its set: --video_path, else data/synthetic
    (under --root_path)."""
    if opt.video_path is not None:
        return Path(opt.video_path)
    return Path(opt.root_path or '.') / DEFAULT_SYNTHETIC_ROOT


def data_paths(opt, ctx):
    """(video_path, annotation_path) of the run. --dataset synthetic generates the
    data set once (video_path is its root, default data/synthetic)."""
    if opt.dataset != 'synthetic':
        return opt.video_path, opt.annotation_path
    root = synthetic_root(opt)
    if ctx.local_rank == 0:
        prepare_synthetic(root, seed=0)
    barrier(ctx)
    video_path, annotation_path = prepare_synthetic(root, seed=0)  # instant once written
    return Path(video_path), opt.annotation_path or Path(annotation_path)


def video_store(opt, video_path):
    """(file_type, ShardStore or None) of the run: a --video_path holding
    util_scripts.make_shards' output (a folder with its index, or a URL) is read
    through a ShardStore (datasets/storage.py), the file type its index's."""
    if opt.dataset == 'synthetic' or video_path is None:
        return opt.file_type, None
    store = open_shards(video_path, opt.storage_options, opt.shard_cache, int(opt.shard_cache_gb * 2**30))
    if store is None:
        return opt.file_type, None
    file_type = store.index().file_type
    if opt.input_type == 'flow' and file_type != 'hdf5':
        raise OptionError(f'--input_type flow needs hdf5 payloads, and the shards at {redact_url(store.location)} '
                          f'hold {file_type} files')
    if opt.decode_device == 'cuda' and file_type == 'video':
        raise OptionError('--decode_device cuda decodes JPEG frames, and these shards hold video files: '
                          'leave --decode_device out')
    return file_type, store


def _mean_std(opt):
    return get_mean_std(opt.value_scale, dataset=opt.mean_dataset,
                        no_mean_norm=opt.no_mean_norm, no_std_norm=opt.no_std_norm)


def _record_table(opt, record, subset):
    """The subset's records as a compact RecordTable, cached under
    <result_path>/data_index/ (a second start-up skips the annotation JSON)."""
    shards = record.shards.index() if record.shards is not None else None
    records, class_names, _ = load_record_table(
        record.annotation_path, subset, record.video_path, opt.dataset,
        file_type=record.file_type, cache_dir=opt.result_path / INDEX_CACHE_DIR, shards=shards)
    return records, class_names


def _checked_records(opt, record, subset):
    records, class_names = _record_table(opt, record, subset)
    check_videos(records, record.file_type, mode=opt.check_frames, input_type=opt.input_type,
                 cache_dir=default_cache_dir(), store=record.shards)
    return records, class_names


def _records(opt, record, subset, ctx=None):
    """The subset's records, checked against the disk (--check_frames). Under
    DDP one rank per node (its local rank 0) builds the index and checks the
    frames; the node's other ranks wait for every node's result and read the
    table from the data_index cache it wrote. A failure anywhere stops every
    rank with the same message."""
    if ctx is None or not ctx.distributed:
        records, class_names = _checked_records(opt, record, subset)
    else:
        records, class_names = _records_once_per_node(opt, record, subset, ctx)
    if record.n_classes is not None and len(class_names) != record.n_classes:
        raise DataError(_class_count_mismatch(record, len(class_names)))
    return records, class_names


def _records_once_per_node(opt, record, subset, ctx):
    # The others wait as long as the check takes (--check_frames decode: hours
    # on a large set), past the start-up collectives' 30 minutes: on a group
    # of their own. A rank that dies meanwhile ends the job through its launcher.
    waiting = dist.new_group(backend='gloo', timeout=CHECK_WAIT)
    try:
        return _check_on_local_rank_0(opt, record, subset, ctx, waiting)
    finally:
        dist.destroy_process_group(waiting)


def _check_on_local_rank_0(opt, record, subset, ctx, group):
    built, failure, error = None, None, None
    if ctx.local_rank == 0:
        try:
            built = _checked_records(opt, record, subset)
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, then it is raised
            failure = (type(e).__name__, str(e), ctx.rank)
            error = e
    failures = [None] * ctx.world_size
    dist.all_gather_object(failures, failure, group=group)  # every rank waits here
    first = next((f for f in failures if f is not None), None)
    if first is not None:
        if failure is not None:
            raise error
        kinds = {e.__name__: e for e in USER_ERRORS}
        name, message, rank = first
        if name in kinds:
            raise kinds[name](message)
        raise RuntimeError(f'rank {rank} failed checking the {subset} videos: {name}: {message}')
    return built if built is not None else _record_table(opt, record, subset)


def _class_count_mismatch(record, n_labels):
    found = f'{record.annotation_path} has {n_labels} labels'
    if record.resume_path is not None:
        return (f'--resume_path {record.resume_path} has {record.n_classes} classes but {found}: '
                f'resume with the annotation it was trained on (another class count: start from '
                f'its weights with --pretrain_path)')
    return (f'--n_classes is {record.n_classes} but {found}: leave --n_classes out (it defaults '
            f'to the annotation\'s count) or set --n_classes {n_labels}')


def decode_on_device(opt, ctx):
    """Whether the main process decodes the JPEG frames (--decode_device cuda);
    refused in one line without a GPU (the decoder is looked for when the
    loaders are built: datasets/device_jpeg.py)."""
    if opt.decode_device != 'cuda':
        return False
    if ctx.device.type != 'cuda':
        raise OptionError(f'--decode_device cuda needs a CUDA GPU, and this process runs on '
                          f'{ctx.device} (torch.cuda.is_available() is '
                          f'{torch.cuda.is_available()}): leave --decode_device out to decode '
                          f'in the loader workers')
    return True


def _finish(dataset, spatial, record):
    """With --normalize_on_device the workers hand over uint8 clips, which the
    loader's ToDevice normalizes after the copy to the device; with
    --decode_device cuda they hand over JPEG bytes, decoded, cropped and
    normalized there."""
    if record.normalize_on_device or record.decode_on_device:
        spatial.defer_normalization()
    return dataset


def clip_loader(file_type, input_type, index_dir=None, defer_decoding=False, store=None):
    """The clip loader of a file type (datasets/loader.py), for training,
    validation, inference and predict.py alike: frames are decoded (JPEG) or
    converted to RGB (video, FFmpeg's scaler) at the scale the spatial
    transform's planned crop needs. With ``index_dir`` a video loader demuxes
    each video's frame index (keyframes, timestamps) once per run, not once per
    open, kept across epochs and workers (datasets/video_index.py).
    defer_decoding: JPEG bytes for the main process to decode (--decode_device).
    store: the ShardStore the payloads are read from (its videos' frame indexes
    are demuxed from the bytes in memory on each open)."""
    loader = make_loader(file_type, input_type, defer_decoding=defer_decoding, store=store)
    if file_type == 'video' and index_dir is not None and store is None:
        loader.frame_table = FrameTable(index_dir)
        loader.frame_table.compact()
    return loader


def eval_views(opt, n_clips, stride, crop):
    """(temporal, spatial) views of validation, inference and predict.py with
    ``opt``'s input settings (a run's options or a checkpoint's): ``n_clips``
    clips spread evenly over a video, or with ``n_clips`` 0 a sliding window
    of ``stride`` frames; ``crop`` spatial views (center, nocrop, three)."""
    if n_clips > 0:
        temporal = TemporalEvenCrop(opt.sample_duration, n_clips, opt.sample_t_stride)
    else:
        temporal = SlidingWindow(opt.sample_duration, stride, opt.sample_t_stride)
    mean, std = _mean_std(opt)
    spatial = build_eval_transform(opt.sample_size, mean=mean, std=std,
                                   value_scale=opt.value_scale, crop=crop)
    return temporal, spatial


def _index_dir(opt):
    return opt.result_path / INDEX_CACHE_DIR / 'frames'


def get_training_data(opt, record, ctx=None):
    records, class_names = _records(opt, record, 'training', ctx)
    if opt.train_t_crop == 'random':
        temporal = TemporalRandomCrop(opt.sample_duration, opt.sample_t_stride)
    else:
        temporal = TemporalCenterCrop(opt.sample_duration, opt.sample_t_stride)
    mean, std = _mean_std(opt)
    spatial = build_train_transform(opt.sample_size, train_crop=opt.train_crop,
                                    min_scale=opt.train_crop_min_scale,
                                    min_ratio=opt.train_crop_min_ratio,
                                    hflip=not opt.no_hflip, colorjitter=opt.colorjitter,
                                    mean=mean, std=std, value_scale=opt.value_scale,
                                    randaugment=opt.randaugment, random_erasing=opt.random_erasing)
    loader = clip_loader(record.file_type, opt.input_type, index_dir=_index_dir(opt),
                         defer_decoding=record.decode_on_device, store=record.shards)
    return _finish(VideoClipDataset(records, loader, temporal, spatial), spatial, record), class_names


def get_validation_data(opt, record, ctx=None):
    """One item per video: n_val_samples clips spread evenly over it."""
    records, class_names = _records(opt, record, 'validation', ctx)
    temporal, spatial = eval_views(opt, opt.n_val_samples, 0, 'center')
    loader = clip_loader(record.file_type, opt.input_type, _index_dir(opt), record.decode_on_device,
                         record.shards)
    return _finish(VideoClipDataset(records, loader, temporal, spatial), spatial, record), class_names


def get_inference_data(opt, record, ctx=None):
    """One item per clip (sliding window, or --inference_n_clips clips spread
    evenly); a video's clips are contiguous. With --inference_crop three an item
    holds the clip's three crops."""
    records, class_names = _records(opt, record, SUBSET_NAMES[opt.inference_subset], ctx)
    temporal, spatial = eval_views(opt, opt.inference_n_clips, opt.inference_stride,
                                   opt.inference_crop)
    loader = clip_loader(record.file_type, opt.input_type, _index_dir(opt), record.decode_on_device,
                         record.shards)
    return _finish(VideoWindowDataset(records, loader, temporal, spatial), spatial, record), \
        class_names


class VideoDataLoader(DataLoader):
    """A DataLoader that raises a worker's DataError in the main process with the
    worker's message as it was: the data sets hand it back as a BadVideo value,
    because DataLoader would re-raise it with a traceback pasted into the text.
    Its workers leave stop signals to the main process (shield_loader_worker);
    a worker that dies anyway is reported in one line (utils/failures.py)."""

    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, collate_fn=collate, worker_init_fn=shield_loader_worker,
                         **kwargs)

    def __iter__(self):
        with stop_signals_blocked():  # until each worker has its shield
            batches = super().__iter__()
        for batch in batches:
            if isinstance(batch, BadVideo):
                raise (StorageError if batch.storage else DataError)(batch.message)
            yield batch


def _on_device(loader, dataset, opt, ctx, with_targets):
    """`loader` with its batches on ctx.device: decoded there when the data
    set's loader defers decoding (--decode_device cuda), normalized there when
    its spatial transform deferred it, in channels_last_3d with --channels_last.
    Over SkipBadVideos (--on_bad_video skip) an item whose frames fail to
    decode there is left out of its batch and reported as a worker reports one."""
    spatial = dataset.spatial_transform
    decoder = None
    if getattr(dataset.loader, 'defer_decoding', False):  # the video loader never defers
        bad_videos = dataset if isinstance(dataset, SkipBadVideos) else None
        decoder = BatchDecoder(spatial, device_jpeg_decoder(ctx.device), bad_videos)
    to_device = ToDevice(ctx.device, spatial.device_normalizer, opt.channels_last, decoder)
    return DeviceLoader(loader, to_device, with_targets)


def _loader_kwargs(opt, ctx):
    # Workers are not persistent: each epoch's workers are seeded afresh from
    # that epoch's seed (seed_worker_rngs), which makes resumed runs exact.
    kwargs = dict(num_workers=opt.n_threads, pin_memory=ctx.device.type == 'cuda')
    if opt.n_threads > 0:
        kwargs['prefetch_factor'] = 4
    return kwargs


def short_video_warnings(opt, train, val) -> list[str]:
    """Clips of videos shorter than a clip are loop-padded: a line for each data set that has some."""
    lines = []
    for name, dataset in (('training', train), ('validation', val)):
        if dataset is None or not hasattr(dataset, 'records'):
            continue
        short = count_short_videos(dataset.records, opt.sample_duration, opt.sample_t_stride)
        if short:
            lines.append(f'warning: {short} of {len(dataset.records)} {name} videos are shorter than '
                         f'a clip (--sample_duration {opt.sample_duration}, --sample_t_stride '
                         f'{opt.sample_t_stride}): their clips repeat frames (loop padding)')
    return lines


def per_process_batch(batch_size, ctx, option='--batch_size'):
    if batch_size % ctx.world_size:
        raise OptionError(f'{option} {batch_size} is the global batch and must be divisible '
                         f'by the number of processes ({ctx.world_size})')
    return batch_size // ctx.world_size


def make_train_loader(dataset, opt, ctx):
    """Shuffles with DistributedSampler in every run (a single process is one
    replica), so the order depends only on --manual_seed and the epoch: a
    resumed run sees the same batches as an uninterrupted one."""
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                 shuffle=True, seed=opt.manual_seed, drop_last=False)
    micro_batch = per_process_batch(opt.batch_size, ctx)
    if micro_batch > len(sampler):
        raise DataError(f'--batch_size {opt.batch_size} is larger than the training set '
                        f'({len(dataset)} videos over {ctx.world_size} processes): lower it')
    # Resumable at any batch (utils/resumable_data.py); the loader's own
    # generator keeps its worker seeds out of the global random state.
    # drop_last: a 1-clip batch breaks BatchNorm and distorts the epoch mean.
    loader = VideoDataLoader(SeededSamples(dataset, opt.manual_seed), batch_size=micro_batch,
                             sampler=ResumableSampler(sampler), drop_last=True,
                             generator=torch.Generator(), **_loader_kwargs(opt, ctx))
    return _on_device(loader, dataset, opt, ctx, with_targets=True)


def make_val_loader(dataset, opt, ctx):
    sampler = ShardSampler(len(dataset), ctx.rank, ctx.world_size)
    batch = max(1, per_process_batch(opt.batch_size, ctx) // max(1, opt.n_val_samples))
    loader = VideoDataLoader(dataset, batch_size=batch, sampler=sampler, **_loader_kwargs(opt, ctx))
    return _on_device(loader, dataset, opt, ctx, with_targets=True)


def make_inference_loader(dataset, opt, ctx):
    # Whole videos per rank (their windows are averaged on one rank), balanced
    # by window count so long videos do not leave one rank behind.
    sampler = dataset.shard(ctx.rank, ctx.world_size)
    # The batch counts views: an item of three crops is three of them.
    views_per_item = getattr(dataset.spatial_transform, 'n_crops', 1)
    batch = max(1, opt.inference_batch_size // ctx.world_size // views_per_item)
    loader = VideoDataLoader(dataset, batch_size=batch, sampler=sampler, **_loader_kwargs(opt, ctx))
    return _on_device(loader, dataset, opt, ctx, with_targets=False)


def seed_worker_rngs(seed):
    """Seeds the main process; DataLoader draws each epoch's worker seeds from it."""
    seed_everything(seed)
