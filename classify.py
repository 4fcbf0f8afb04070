"""Classifying video files with a trained checkpoint (predict.py without
--stream; live.py classifies a live source).

The videos are found (one file, a frame folder or an hdf5 file, a folder tree
of them, or util_scripts.make_shards' shards), their frames counted, and their
views -- those of --inference: --n_clips clips spread over each video, or a
sliding window, times the crops -- loaded through main.py's inference loaders
into a VideoWindowDataset. The views are scored in batches across videos by
inference.score_views (live.py scores its windows through it too); a video's
score is the mean of its views' softmax. A view that cannot be loaded names
its video, which is skipped; the others go on. With true labels (an
annotation file, or class folders named like the checkpoint's classes) the
accuracy is computed; with one video its windows' scores can be drawn over
time (--timeline) or into the video (--output_video); the pooled features
are written with --extract_features.
"""
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, default_collate
from tqdm import tqdm

import dataset as data
from checkpoint import load_trained_model
from datasets import formats
from datasets.annotation import VideoRecord, read_annotation, video_labels
from datasets.device_batches import DeviceLoader, ToDevice
from datasets.formats import VIDEO_EXTENSIONS, video_kind
from datasets.videodataset import BadVideo, VideoWindowDataset
from inference import ViewScores, score_views, topk_entries, write_features
from model import classifier_name
from utils.errors import DataError, OptionError, StorageError
from utils.urls import redact_url


@dataclass(frozen=True)
class VideoInput:
    video_id: str  # the file or folder name without extension (with its folders if not unique)
    path: str
    kind: str  # 'jpg', 'hdf5' or 'video'
    folder: str | None = None  # the folder it sits in under the folder searched (its class?)
    n_frames: int | None = None  # known without reading it (a shard index's count)


def _name(path, kind):
    return path.name if kind == 'jpg' else path.stem


def _walk(folder):
    """(path, kind) of the videos under folder, sorted, depth first; a frame
    folder is one video, other folders are searched."""
    for path in sorted(folder.iterdir()):
        if path.name.startswith('.'):  # also macOS '._x.mp4' resource forks
            continue
        kind = video_kind(path)
        if kind is not None:
            yield path, kind
        elif path.is_dir():
            yield from _walk(path)


def find_inputs(path):
    """The videos at ``path``: itself if it is one, else the videos in it and
    in its subfolders (sorted by path)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f'{path} does not exist: give a video file, a frame folder, an hdf5 '
                        f'file or a folder of them')
    kind = video_kind(path)
    if kind is not None:
        return [VideoInput(_name(path, kind), str(path), kind)]
    if not path.is_dir():
        raise DataError(f'{path} is not a video this tool reads (a {", ".join(VIDEO_EXTENSIONS)}'
                        f' file, a folder of image_NNNNN.jpg frames or a .hdf5 file)')
    found = list(_walk(path))
    if not found:
        raise DataError(f'{path} holds no video (video files, frame folders or hdf5 files), '
                        f'nor do its subfolders')
    return _named(path, found)


def _named(root, found):
    """VideoInputs whose ids are the names, or the paths under root (without
    extension) where a name occurs twice (as folder_json keys them)."""
    rel = [(p.relative_to(root).parent / _name(p, k)).as_posix() for p, k in found]
    twice = sorted(i for i, n in Counter(rel).items() if n > 1)
    if twice:
        raise DataError(f'{root} holds two videos named {twice[0]!r} (e.g. a file and a '
                        f'frame folder): video ids must be unique')
    names = [_name(p, k) for p, k in found]
    count = Counter(names)
    inputs = []
    for (p, k), path_id, name in zip(found, rel, names):
        parent = p.relative_to(root).parent
        inputs.append(VideoInput(name if count[name] == 1 else path_id, str(p), k,
                                 parent.name if parent != Path('.') else None))
    return inputs


# ----------------------------------------------------------------------------- shard locations

def open_store(args):
    """The ShardStore of a VIDEO_OR_FOLDER holding util_scripts.make_shards' output (a URL,
    or a folder with its index.json), its index read; None for a video or a folder of them."""
    from datasets.storage import open_shards
    try:
        store = open_shards(args.video, args.storage_options, args.shard_cache)
    except OptionError:
        raise
    except (DataError, StorageError) as e:  # their messages name main.py's option
        raise type(e)(str(e).replace('--video_path', 'VIDEO_OR_FOLDER')) from None
    if store is None and (args.storage_options is not None or args.shard_cache is not None):
        raise OptionError(f'--storage_options and --shard_cache are for shards (a folder with index.json, an '
                          f'http(s):// or s3:// URL), and {args.video} holds none: leave them out')
    return store


def shard_inputs(store):
    """A VideoInput per video of the store's index, sorted by REL (<label>/<video_id>,
    test/<video_id>), named as _named names those of a folder tree: the last component,
    REL where that occurs twice; its folder the class folder, its frame count the index's."""
    index = store.index()
    if not len(index):
        raise DataError(f'the shards at {redact_url(store.location)} hold no video')
    rels = index.paths.tolist()
    names = [rel.rsplit('/', 1)[-1] for rel in rels]
    count = Counter(names)
    return [VideoInput(name if count[name] == 1 else rel, rel, index.file_type,
                       rel.rsplit('/', 2)[-2] if '/' in rel else None, n)
            for rel, name, n in zip(rels, names, index.columns['n_frames'].tolist())]


def find_videos(args):
    """(VideoInputs, the ShardStore they are read through or None) of VIDEO_OR_FOLDER."""
    store = open_store(args)
    return (find_inputs(args.video), None) if store is None else (shard_inputs(store), store)


def check_window_outputs(args, videos, store):
    """--timeline and --output_video take one video, and not from shards."""
    if args.timeline is None and args.output_video is None:
        return
    if store is not None:
        raise OptionError(f'--timeline and --output_video read a video file, a frame folder or an hdf5 file, '
                          f'not shards ({redact_url(store.location)}): give the video itself')
    if len(videos) != 1:
        raise OptionError(f'--timeline and --output_video take one video; {args.video} holds '
                          f'{len(videos)}')


def frame_count(video):
    """Number of frames of a VideoInput (decodes a video file only when its
    container does not say); a shard index's count as it is."""
    if video.n_frames is not None:
        return video.n_frames
    if video.kind != 'hdf5':
        return formats.frame_count(video.path, video.kind)
    try:
        n = formats.frame_count(video.path, 'hdf5')
    except OSError as e:
        raise DataError(f'{video.path} is not a video hdf5 file (datasets video or '
                        f'video_u/video_v): {e}') from None
    if n is None:
        raise DataError(f'{video.path} is not a video hdf5 file: it has no dataset video '
                        f'(nor video_u/video_v)')
    return n


class InputLoader:
    """``loader(path, positions)`` and ``loader.read(path, positions)`` for a mix
    of frame folders, hdf5 and video files: those of the clip loader
    ``make(kind)`` of each path's kind. With ``read`` the data set decodes at the
    scale the spatial transform plans (datasets/videodataset.py), as main.py's
    --inference does with the same loaders: the same clips."""

    def __init__(self, kinds, make):
        self.kinds = dict(kinds)  # path -> kind
        self.loaders = {kind: make(kind) for kind in set(self.kinds.values())}

    def __call__(self, path, positions):
        return self.loaders[self.kinds[path]](path, positions)

    def read(self, path, positions):
        """An EncodedClip (frame folders, hdf5) or VideoClip (video files), not decoded yet."""
        return self.loaders[self.kinds[path]].read(path, positions)


def load_model(path, defaults, annotation_path, device, weights):
    """(network, options, class names, device) of a checkpoint, or of an .onnx
    file written by util_scripts.export (run by onnxruntime on the CPU);
    defaults: every option's default (opts.option_defaults), for the checkpoint's options."""
    if Path(path).suffix != '.onnx':
        return (*load_trained_model(path, defaults, annotation_path, device, weights), device)
    if weights != 'raw':
        raise OptionError(f'{path} holds the weights it was exported with (export --weights): '
                          f'leave --weights out')
    from utils.exported import OnnxClassifier
    model = OnnxClassifier(path)  # export writes the class names: they name the outputs
    return model, model.options, model.class_names, torch.device('cpu')


def view_transforms(options, n_clips, stride, crop):
    """Temporal and spatial views of inference with the checkpoint's input
    settings: a sliding window when ``stride`` is given, else ``n_clips`` clips."""
    return data.eval_views(options, 0 if stride else n_clips, stride, crop)


def measure_videos(videos, failures, progress=False):
    """VideoRecords of the videos whose frames can be counted; the others go
    to ``failures`` ({video_id: message})."""
    records = []
    for v in tqdm(videos, desc='counting frames', unit='video', file=sys.stderr,
                  disable=not progress, leave=False, dynamic_ncols=True):
        try:
            n = frame_count(v)
        except DataError as e:
            failures[v.video_id] = str(e)
            continue
        except OSError as e:
            failures[v.video_id] = f'{v.path} cannot be read ({e.strerror or e})'
            continue
        if n < 1:
            failures[v.video_id] = f'{v.path} has no frames'
            continue
        records.append(VideoRecord(v.video_id, v.path, 0, n, -1, (0, n)))
    return records


def build_dataset(records, videos, options, n_clips, stride, crop, store=None):
    """store: the ShardStore the videos' payloads are read through (their paths are REL keys)."""
    temporal, spatial = view_transforms(options, n_clips, stride, crop)
    loader = InputLoader({v.path: v.kind for v in videos},  # main.py's inference loaders
                         lambda kind: data.clip_loader(kind, options.input_type, store=store))
    return VideoWindowDataset(records, loader, temporal, spatial)


@dataclass(frozen=True)
class FailedView:
    video: int  # index of its record
    message: str
    storage: bool = False  # a StorageError: the shards could not be fetched


class SkippingWindows(Dataset):
    """The views of a VideoWindowDataset; one that cannot be loaded becomes a
    FailedView naming its video, so that the other videos go on."""

    def __init__(self, windows):
        self.windows = windows

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        try:
            item = self.windows[i]
        except DataError as e:  # in the main process (n_threads 0)
            item = BadVideo(str(e))
        if isinstance(item, BadVideo):  # a worker's DataError or StorageError
            return FailedView(int(self.windows.video_of_item[i]), item.message, item.storage)
        return item


def collate_views(items):
    """(the loaded views collated, or None; the FailedViews)."""
    good = [item for item in items if not isinstance(item, FailedView)]
    failed = [item for item in items if isinstance(item, FailedView)]
    return (default_collate(good) if good else None), failed


def _good_batches(loader, ids, failures, progress):
    """The loader's batches of loaded views, under a progress bar over videos;
    a failed view's video goes to ``failures``; shards that could not be fetched
    stop the run (no video is to blame: none is skipped for it)."""
    with tqdm(total=len(ids), desc='classifying', unit='video', file=sys.stderr,
              disable=not progress, dynamic_ncols=True) as bar:
        for good, failed in loader:
            for view in failed:
                if view.storage:
                    raise StorageError(view.message)
                failures.setdefault(ids[view.video], view.message)
            seen = [view.video for view in failed] + (good[1].tolist() if good else [])
            bar.update(max(0, max(seen) - bar.n))  # videos before the last one seen are done
            if good is not None:
                yield good
        bar.update(len(ids) - bar.n)


def score_videos(dataset, model, device, args, failures, progress=False, keep_views=False,
                 feature_module=None):
    """ViewScores over the data set's videos (batches cross videos); progress: a bar on stderr."""
    n_crops = getattr(dataset.spatial_transform, 'n_crops', 1)
    loader = DataLoader(SkippingWindows(dataset), batch_size=max(1, args.batch_size // n_crops),
                        num_workers=args.n_threads, collate_fn=collate_views,
                        pin_memory=device.type == 'cuda')
    scores = ViewScores(keep_views=keep_views)
    ids = [r.video_id for r in dataset.records]
    batches = _good_batches(loader, ids, failures, progress)
    to_device = ToDevice(device, dataset.spatial_transform.device_normalizer)
    for batch in score_views(DeviceLoader(batches, to_device), model, amp=args.half, amp_dtype='fp16',
                             feature_module=feature_module):
        scores.add(*batch)
    return scores


@dataclass
class Outcome:
    results: dict  # video_id -> [{label, score}] (top-k)
    views: dict  # video_id -> views averaged
    ranked: dict  # video_id -> every label, best first
    features: dict | None  # video_id -> mean pooled feature


def outcome(scores, records, class_names, topk, failures, with_features=False):
    """The results of the videos none of whose views failed."""
    out = Outcome({}, {}, {}, {} if with_features else None)
    for v, record in enumerate(records):
        if record.video_id in failures or v not in scores.counts:
            continue
        mean = scores.mean(v)
        out.results[record.video_id] = topk_entries(mean, class_names, topk)
        out.views[record.video_id] = scores.counts[v]
        out.ranked[record.video_id] = [class_names[i] for i in
                                       mean.argsort(descending=True, stable=True).tolist()]
        if with_features:
            out.features[record.video_id] = scores.mean_features(v)
    return out


# ----------------------------------------------------------------------------- true labels

def annotation_labels(annotation_path):
    """{video_id: label} of an annotation file's labelled entries (any subset)."""
    entries = video_labels(read_annotation(annotation_path, check='--annotation_path'))
    return {video_id: label for video_id, (_, label) in entries.items() if label is not None}


def true_labels(videos, class_names, annotation_path=None):
    """({video_id: label} of the videos whose class is known, a note or None):
    from the annotation's entries (by id, or by name), else from the folder a
    video sits in when it is named like one of the classes."""
    if annotation_path is not None:
        known = annotation_labels(annotation_path)
        truth = {}
        for v in videos:
            label = known.get(v.video_id, known.get(v.video_id.rsplit('/', 1)[-1]))
            if label is not None:
                truth[v.video_id] = label
        missing = len(videos) - len(truth)
        return truth, (f'{missing} of {len(videos)} videos have no label in {annotation_path}: '
                       f'not counted' if missing and truth else None)
    names = set(class_names)
    truth = {v.video_id: v.folder for v in videos if v.folder in names}
    others = sorted({v.folder for v in videos if v.folder is not None and v.folder not in names})
    note = None
    if truth and others:
        note = (f'{len(others)} folder(s) not named like a class of the checkpoint, their videos '
                f'not counted: {", ".join(others[:5])}')
    return truth, note


def accuracy_lines(truth, ranked, class_names, failures):
    """top-1, top-5 (skipped below 5 classes) and mean class accuracy over the
    classified videos with a true label."""
    from utils.metrics import evaluate_ranked
    scored = {v: label for v, label in truth.items() if v in ranked}
    if not scored:
        return []
    try:
        evaluation = evaluate_ranked(scored, ranked, class_names, ignore=True, ks=(1, 5))
    except ValueError as e:  # labels that are not the checkpoint's classes: results stand
        return [f'accuracy not computed: {e}']
    unread = sum(v in failures for v in truth)
    head = f'accuracy over the {len(scored)} classified videos with a true label' + (
        f' ({unread} that could not be read not counted)' if unread else '') + ':'
    return [head, *('  ' + line for line in evaluation.summary_lines())]


# ----------------------------------------------------------------------------- one long video

def frame_rate(video, fallback):
    """A video file's frame rate; frame folders and hdf5 files do not say (fallback)."""
    if video.kind == 'video':
        import av

        from datasets.video_stream import video_stream
        with av.open(video.path) as container:
            stream = video_stream(container)  # the one the loader reads
            rate = stream and (stream.average_rate or stream.guessed_rate)
        if rate:
            return float(rate)
    return fallback


def write_window_outputs(args, video, record, scores, class_names, input_type):
    """--timeline and --output_video of the one video classified."""
    from utils.timeline import (
        captions,
        timeline_data,
        window_scores,
        write_labelled_video,
        write_timeline,
    )
    windows = window_scores(scores.views[0])
    fps = frame_rate(video, args.fps)
    if args.timeline is not None:
        write_timeline(args.timeline, timeline_data(video.video_id, windows, class_names, fps,
                                                    args.topk))
        print(f'timeline: {args.timeline} ({len(windows)} windows)', file=sys.stderr)
    if args.output_video is not None:
        if input_type != 'rgb':
            raise OptionError('--output_video needs an RGB checkpoint (this one takes flow)')
        loader = InputLoader({video.path: video.kind},  # full-size frames
                             lambda kind: data.clip_loader(kind, input_type))
        n = record.n_frames
        chunks = (loader(video.path, list(range(a, min(a + 64, n)))) for a in range(0, n, 64))
        written = write_labelled_video(args.output_video, chunks,
                                       captions(windows, class_names, n), fps)
        print(f'labelled video: {args.output_video} ({written} frames at {fps:g} fps)',
              file=sys.stderr)


def window_stride(args, options):
    """--stride, or with --timeline / --output_video and none given, the window's
    span (windows side by side, each frame in one)."""
    if args.stride or (args.timeline is None and args.output_video is None):
        return args.stride
    return options.sample_duration * options.sample_t_stride


def check_annotation_path(path):
    """A missing --annotation_path in predict's terms (the annotation reader's
    message names main.py's --root_path and --dataset synthetic)."""
    if path is not None and not path.is_file():
        raise DataError(f'annotation file {path} not found: check --annotation_path')


def chosen_device(args):
    if args.device is not None:
        if args.device == 'cuda' and not torch.cuda.is_available():
            raise OptionError('--device cuda: no GPU is visible to PyTorch here; leave --device out')
        return torch.device(args.device)
    return torch.device('cuda' if torch.cuda.is_available() and not args.no_cuda else 'cpu')


def run_files(args, defaults, failures, progress=False):
    """Classifies predict.py's VIDEO_OR_FOLDER as ``args`` (its parsed command line) ask, and
    writes the outputs they name: (the VideoInputs, their Outcome, the accuracy lines). A
    video that cannot be read goes to ``failures`` ({video_id: message}); defaults: every
    option's default (opts.option_defaults); progress: bars on stderr."""
    check_annotation_path(args.annotation_path)
    device = chosen_device(args)
    videos, store = find_videos(args)
    check_window_outputs(args, videos, store)
    model, options, class_names, device = load_model(args.checkpoint, defaults, args.annotation_path,
                                                     device, args.weights)
    head = None
    if args.extract_features is not None:
        if not isinstance(model, torch.nn.Module):
            raise OptionError('--extract_features needs the checkpoint, not an exported file')
        head = model.get_submodule(classifier_name(options.model))
    records = measure_videos(videos, failures, progress)
    windows = bool(args.timeline or args.output_video)
    out = Outcome({}, {}, {}, {} if head is not None else None)
    if records:
        dataset = build_dataset(records, videos, options, args.n_clips,
                                window_stride(args, options), args.crop, store)
        scores = score_videos(dataset, model, device, args, failures, progress, keep_views=windows,
                              feature_module=head)
        out = outcome(scores, records, class_names, args.topk, failures, head is not None)
        if windows and out.results:
            write_window_outputs(args, videos[0], records[0], scores, class_names,
                                 options.input_type)
    truth, note = true_labels(videos, class_names, args.annotation_path)
    if note:
        print(f'note: {note}', file=sys.stderr)
    if out.features:
        write_features(args.extract_features, list(out.features), list(out.features.values()),
                       [out.views[v] for v in out.features])
    return videos, out, accuracy_lines(truth, out.ranked, class_names, failures)

