"""Classify your own videos with a trained checkpoint.

    python predict.py results/demo/save_15.pth my_video.mp4
    python predict.py results/demo/save_15.pth folder_of_videos --topk 3 --json

VIDEO_OR_FOLDER is one video -- a video file (.mp4, .avi, .webm, .mkv), a
folder of frames (image_00001.jpg, ...) or an hdf5 file -- or a folder of
them. The architecture, the input settings and the class names come from the
checkpoint; the views are those of --inference (--n_clips clips evenly spread
over each video, or a sliding window with --stride, times --crop crops) and
the video's score is the mean of their softmax.
"""
import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from dataset import VideoDataLoader
from datasets.annotation import DataError, VideoRecord, load_class_names
from datasets.loader import make_loader
from datasets.spatial_transforms import EVAL_CROPS, build_eval_transform, get_mean_std
from datasets.temporal_transforms import SlidingWindow, TemporalEvenCrop
from datasets.videodataset import VideoWindowDataset
from inference import ViewScores, score_views, topk_entries, write_features
from model import classifier_name, generate_model, load_state_dict_checked
from opts import OptionError, build_parser
from utils.checkpoint import CheckpointError, load_checkpoint
from utils.ema import inference_state_dict

HDF5_SUFFIXES = ('.hdf5', '.h5')


@dataclass(frozen=True)
class VideoInput:
    video_id: str  # the file or folder name without extension
    path: str
    kind: str  # 'jpg', 'hdf5' or 'video'


def _is_frame_folder(path):
    with os.scandir(path) as entries:
        return any(e.name.startswith('image_') and e.name.endswith('.jpg') for e in entries)


def _kind(path):
    if path.is_dir():
        return 'jpg' if _is_frame_folder(path) else None
    suffix = path.suffix.lower()
    if suffix in HDF5_SUFFIXES:
        return 'hdf5'
    return 'video' if suffix in video_suffixes() else None


def find_inputs(path):
    """The videos at ``path``: itself if it is one, else the videos directly in
    it (sorted by name)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f'{path} does not exist: give a video file, a frame folder, an hdf5 '
                        f'file or a folder of them')
    kind = _kind(path)
    if kind is not None:
        return [VideoInput(path.stem if kind != 'jpg' else path.name, str(path), kind)]
    if not path.is_dir():
        raise DataError(f'{path} is not a video this tool reads (a {", ".join(video_suffixes())}'
                        f' file, a folder of image_NNNNN.jpg frames or a .hdf5 file)')
    found = [VideoInput(p.stem if p.is_file() else p.name, str(p), k)
             for p in sorted(path.iterdir()) if (k := _kind(p)) is not None]
    if not found:
        raise DataError(f'{path} holds no video (video files, frame folders or hdf5 files)')
    ids = [v.video_id for v in found]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise DataError(f'{path} holds two videos named {twice[0]!r} (e.g. a file and a '
                        f'frame folder): video ids must be unique')
    return found


def video_suffixes():
    from datasets.video import VIDEO_EXTENSIONS
    return VIDEO_EXTENSIONS


def frame_count(video):
    """Number of frames of a VideoInput (decodes a video file only when its
    container does not say)."""
    if video.kind == 'jpg':
        with os.scandir(video.path) as entries:
            return sum(e.name.startswith('image_') and e.name.endswith('.jpg') for e in entries)
    if video.kind == 'hdf5':
        import h5py
        try:
            with h5py.File(video.path, 'r') as f:
                return len(f['video'] if 'video' in f else f['video_u'])
        except (OSError, KeyError) as e:
            raise DataError(f'{video.path} is not a video hdf5 file (datasets video or '
                            f'video_u/video_v): {e}') from None
    from datasets.video import count_frames
    return count_frames(video.path)[0]


class InputLoader:
    """``loader(path, positions)`` for a mix of frame folders, hdf5 and video
    files: the clip loader of each path's kind."""

    def __init__(self, kinds, input_type='rgb'):
        self.kinds = dict(kinds)  # path -> kind
        self.loaders = {}
        for kind in set(self.kinds.values()):
            if kind == 'video':
                if input_type != 'rgb':
                    raise DataError('this checkpoint takes optical flow: give hdf5 files with '
                                    'video_u/video_v, not video files')
                from datasets.video import VideoClipLoader
                self.loaders[kind] = VideoClipLoader()
            else:
                self.loaders[kind] = make_loader(kind, input_type)

    def __call__(self, path, positions):
        return self.loaders[self.kinds[path]](path, positions)


def stored_options(checkpoint, path):
    """The options the checkpoint's run was started with, over today's defaults
    (options added since then keep their defaults)."""
    stored = checkpoint.get('opts')
    if not isinstance(stored, dict):
        raise CheckpointError(f'{path} holds no options ("opts"): it was not written by '
                              f'main.py, so the architecture is unknown')
    options = vars(build_parser().parse_args([]))
    options.update(stored)
    # the run's own values when it resumed without repeating them (main.py)
    options.update({k: checkpoint[k] for k in ('n_classes', 'ft_begin_module') if k in checkpoint})
    options['n_input_channels'] = 2 if options['input_type'] == 'flow' else 3
    return argparse.Namespace(**options)


def class_names_of(checkpoint, path, annotation_path=None):
    if annotation_path is not None:
        return load_class_names(annotation_path)
    names = checkpoint.get('class_names')
    if not names:
        raise CheckpointError(f'{path} stores no class names (written before they were '
                              f'saved): pass --annotation_path with the training annotation')
    return list(names)


def load_trained_model(path, annotation_path=None, device='cpu', weights='raw'):
    """(network in eval mode on ``device``, its options, its class names);
    weights='ema' takes the checkpoint's EMA weights (--ema_decay runs)."""
    checkpoint = load_checkpoint(path)
    options = stored_options(checkpoint, path)
    class_names = class_names_of(checkpoint, path, annotation_path)
    if len(class_names) != options.n_classes:
        raise OptionError(f'{path} has {options.n_classes} classes but {len(class_names)} '
                          f'class names were found: check --annotation_path')
    model = generate_model(options)
    state_dict = inference_state_dict(checkpoint, weights, f'checkpoint {path}')
    load_state_dict_checked(model, state_dict, f'checkpoint {path}', options)
    return model.to(device).eval(), options, class_names


def view_transforms(options, n_clips, stride, crop):
    """Temporal and spatial views of inference with the checkpoint's input settings."""
    if stride:
        temporal = SlidingWindow(options.sample_duration, stride, options.sample_t_stride)
    else:
        temporal = TemporalEvenCrop(options.sample_duration, n_clips, options.sample_t_stride)
    mean, std = get_mean_std(options.value_scale, dataset=options.mean_dataset,
                             no_mean_norm=options.no_mean_norm, no_std_norm=options.no_std_norm)
    spatial = build_eval_transform(options.sample_size, mean=mean, std=std,
                                   value_scale=options.value_scale, crop=crop)
    return temporal, spatial


def build_dataset(videos, options, n_clips, stride, crop):
    records = []
    for v in videos:
        n = frame_count(v)
        if n < 1:
            raise DataError(f'{v.path} has no frames')
        records.append(VideoRecord(v.video_id, v.path, 0, n, -1, (0, n)))
    temporal, spatial = view_transforms(options, n_clips, stride, crop)
    loader = InputLoader({v.path: v.kind for v in videos}, options.input_type)
    return VideoWindowDataset(records, loader, temporal, spatial)


def predict(dataset, model, class_names, device, args, feature_module=None):
    """{video_id: [{label, score}]}, {video_id: views} and, with a feature
    module, {video_id: mean pooled feature}."""
    n_crops = getattr(dataset.spatial_transform, 'n_crops', 1)
    # VideoDataLoader: a bad video in a worker is one DataError naming it
    loader = VideoDataLoader(dataset, batch_size=max(1, args.batch_size // n_crops),
                             num_workers=args.n_threads)
    scores = ViewScores()
    for batch in score_views(loader, model, device, feature_module=feature_module):
        scores.add(*batch)
    ids = [r.video_id for r in dataset.records]
    results = {ids[v]: topk_entries(scores.mean(v), class_names, args.topk)
               for v in range(len(ids))}
    views = {ids[v]: scores.counts[v] for v in range(len(ids))}
    features = {ids[v]: scores.mean_features(v) for v in range(len(ids))} \
        if feature_module is not None else None
    return results, views, features


def parse_args(argv=None):
    p = argparse.ArgumentParser(description='Classify videos with a trained checkpoint.')
    p.add_argument('checkpoint', type=Path, help='save_<epoch>.pth written by main.py')
    p.add_argument('video', type=Path, metavar='VIDEO_OR_FOLDER',
                   help='a video file, a frame folder, an hdf5 file, or a folder of them')
    p.add_argument('--topk', type=int, default=5, help='classes printed per video')
    p.add_argument('--json', action='store_true',
                   help='print the inference file\'s format: {"results": {video_id: '
                        '[{"label", "score"}, ...]}, "views": {video_id: n}}')
    p.add_argument('--n_clips', type=int, default=10,
                   help='clips evenly spread over each video (like --inference_n_clips)')
    p.add_argument('--stride', type=int, default=0,
                   help='sliding-window stride in frames instead of --n_clips '
                        '(like --inference_stride); 0: use --n_clips')
    p.add_argument('--crop', default='center', choices=EVAL_CROPS,
                   help='spatial views (like --inference_crop)')
    p.add_argument('--batch_size', type=int, default=16, help='views per forward pass')
    p.add_argument('--n_threads', type=int, default=2, help='data-loading worker processes')
    p.add_argument('--extract_features', type=Path, default=None, metavar='PATH.h5',
                   help='also write each video\'s pooled features (the classifier\'s input, '
                        'averaged over the views) to this HDF5 file')
    p.add_argument('--annotation_path', type=Path, default=None,
                   help='class names for a checkpoint that does not store them')
    p.add_argument('--weights', default='raw', choices=['raw', 'ema'],
                   help='the trained weights, or their EMA (runs with --ema_decay)')
    p.add_argument('--no_cuda', action='store_true', help='run on the CPU')
    args = p.parse_args(argv)
    if args.n_clips < 1 or args.stride < 0 or args.batch_size < 1:
        p.error('--n_clips and --batch_size must be at least 1, --stride at least 0')
    return args


def format_line(video_id, entries):
    return f'{video_id}: ' + ', '.join(f'{e["label"]} ({e["score"]:.3f})' for e in entries)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device('cuda' if torch.cuda.is_available() and not args.no_cuda else 'cpu')
    try:
        videos = find_inputs(args.video)
        model, options, class_names = load_trained_model(args.checkpoint, args.annotation_path,
                                                         device, args.weights)
        dataset = build_dataset(videos, options, args.n_clips, args.stride, args.crop)
        head = None
        if args.extract_features is not None:
            head = model.get_submodule(classifier_name(options.model))
        results, views, features = predict(dataset, model, class_names, device, args, head)
    except (DataError, OptionError, CheckpointError, FileNotFoundError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    if features is not None:
        write_features(args.extract_features, list(features), list(features.values()),
                       [views[v] for v in features])
    if args.json:
        print(json.dumps({'results': results, 'views': views}))
    else:
        for video_id, entries in results.items():
            print(format_line(video_id, entries))
    return 0


if __name__ == '__main__':
    sys.exit(main())
