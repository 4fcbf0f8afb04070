"""Annotation files -> compact per-video records.

Formats (docs/data.md, File formats):

* kinetics / ucf101 / hmdb51 / mit / synthetic: ``{"labels": [...], "database":
  {video_id: {"subset", "annotations": {"label", "segment": [b, e]},
  "video_path"?}}}``.  ``segment`` is half-open; ``b == 0`` means 0-based frame
  numbers (hdf5-built Kinetics files), otherwise 1-based (jpg-built files).
  Either way every frame is used: ``n_frames = e - b``.
* activitynet: the official file (``taxonomy`` + ``database`` with per-video
  ``annotations`` lists in seconds and ``fps``); one record per annotated
  segment.

Frame *positions* inside the library are 0-based: position ``p`` is
``image_{p+1:05d}.jpg`` in a jpg folder and element ``p`` of an hdf5 file.

Building records does not touch the file system (no stat per video; for
``file_type='video'`` one listing per class folder finds each video's
extension); :func:`datasets.frame_check.check_videos` verifies the videos up
front with one stat (jpg) or one open (hdf5, video) per video.  With ``depends``
:func:`load_annotations` also says which folders and files the records were read
from (what a cache of them depends on: datasets/video_index.py).  The names of
frame files, video extensions and hdf5 datasets are datasets/formats.py's.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from datasets.formats import FILE_TYPES, VIDEO_EXTENSIONS, frame_count, video_files
from utils.errors import DataError

__all__ = ['VideoRecord', 'read_annotation', 'video_labels', 'load_annotations',
           'load_class_names', 'path_signature', 'STANDARD_DATASETS', 'SUBSETS', 'SUBSET_NAMES']

STANDARD_DATASETS = ('kinetics', 'ucf101', 'hmdb51', 'mit', 'synthetic')
SUBSETS = ('training', 'validation', 'testing')
# The short names of --inference_subset and the tools' --subset.
SUBSET_NAMES = {'train': 'training', 'val': 'validation', 'test': 'testing'}
# ActivityNet: segments with fewer frames than this are dropped (as the predecessor did).
ACTIVITYNET_MIN_FRAMES = 8


@dataclass(frozen=True, slots=True)
class VideoRecord:
    """One sample of a subset.  Small and immutable: no per-frame lists.

    ``first_frame`` is the 0-based position of the segment's first frame,
    ``n_frames`` its length; the positions are
    ``range(first_frame, first_frame + n_frames)``.  ``segment`` is the
    annotation's original [begin, end) (1-based for jpg-built files, 0-based
    when begin == 0), kept for inference output.
    """
    video_id: str
    path: str
    first_frame: int
    n_frames: int
    label: int
    segment: tuple[int, int]

    @property
    def positions(self) -> range:
        return range(self.first_frame, self.first_frame + self.n_frames)


_CHECK_PATH = ('--annotation_path (and --root_path, which is prefixed to it), or use '
               '--dataset synthetic for the built-in data set')


def read_annotation(annotation_path, check: str = _CHECK_PATH) -> dict:
    """The parsed annotation file, its "database" an object: the one reader of
    annotation files (training, inference, the evaluation, predict.py).  Raises
    DataError naming the file; ``check`` says what to check when it is missing."""
    path = Path(annotation_path)
    if not path.is_file():
        raise DataError(f'annotation file {path} not found: check {check}')
    try:
        with path.open('r') as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f'annotation file {path} is not valid JSON ({e}): regenerate it '
                        f'with the util_scripts conversion script') from None
    if not isinstance(data, dict) or 'database' not in data:
        raise DataError(f'annotation file {path} has no "database" key: it is not an '
                        f'annotation file of the expected format (labels + database)')
    if not isinstance(data['database'], dict):
        raise DataError(f'annotation file {path}: "database" must be an object '
                        f'mapping video ids to entries')
    return data


def video_labels(data: dict) -> dict[str, tuple[str | None, str | None]]:
    """{video_id: (subset, class name or None)} of a read annotation file's
    entries; an ActivityNet video's class is that of its first segment."""
    labels = {}
    for video_id, entry in data['database'].items():
        if not isinstance(entry, dict):
            continue
        annotations = entry.get('annotations') or {}
        if isinstance(annotations, list):
            annotations = annotations[0] if annotations else {}
        label = annotations.get('label') if isinstance(annotations, dict) else None
        labels[video_id] = (entry.get('subset'), label)
    return labels


def _activitynet_class_names(data: dict, path) -> list[str]:
    taxonomy = data['taxonomy']
    parents = {node['parentId'] for node in taxonomy}
    return [node['nodeName'] for node in taxonomy if node['nodeId'] not in parents]


def _class_names(data: dict, path) -> list[str]:
    if 'labels' in data:
        labels = data['labels']
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise DataError(f'annotation file {path}: "labels" must be a list of class names')
        return list(labels)
    if 'taxonomy' in data:
        return _activitynet_class_names(data, path)
    raise DataError(f'annotation file {path} has no "labels" list (nor an ActivityNet '
                    f'"taxonomy"): regenerate it with the util_scripts conversion script')


def load_class_names(annotation_path) -> list[str]:
    """Class names (index = class id) of an annotation file of either format."""
    return _class_names(read_annotation(annotation_path), annotation_path)


def _is_activitynet(dataset: str) -> bool:
    return dataset.lower() == 'activitynet'


def _resolve(video_path: Path, entry: dict, default: Path) -> str:
    override = entry.get('video_path')
    if override:
        p = Path(override)
        return str(p if p.is_absolute() else video_path / p)
    return str(default)


def _empty_subset_error(path, subset, database: dict, skipped: int = 0) -> DataError:
    present = sorted({str(v.get('subset')) for v in database.values() if isinstance(v, dict)})
    msg = (f"subset '{subset}' of {path} has no videos; subsets present: "
           f"{', '.join(present) or 'none'}")
    if skipped:
        msg += (f" ({skipped} entries of the subset were skipped because they have no "
                f"segment and their video is missing)")
    return DataError(msg)


def path_signature(path) -> list[int] | None:
    """[mtime_ns, size, inode] of a file or folder, None when there is none: a folder's
    mtime changes when an entry in it is renamed, added or removed, a file's when it is
    rewritten, its inode when it is replaced."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def load_annotations(annotation_path, subset: str, video_path, dataset: str,
                     file_type: str = 'jpg', depends: dict | None = None,
                     count=None) -> tuple[list[VideoRecord], list[str]]:
    """Records of ``subset`` ('training' | 'validation' | 'testing') and the class names.

    Paths: ``<video_path>/<label>/<video_id>`` (jpg), ``...<video_id>.hdf5``
    (hdf5) or ``...<video_id>.mp4`` / ``.avi`` / ... (video: the file of that name
    with one of datasets.formats.VIDEO_EXTENSIONS, in any case; DataError when two
    are there); entries without a label (test set) live under
    ``<video_path>/test/``; an entry's ``video_path`` key overrides (relative to
    ``video_path`` unless absolute).  ActivityNet: ``<video_path>/v_<video_id>``.

    Entries that have no ``segment`` (the conversion script could not find
    their video) are counted from disk if their video exists, else skipped
    with a warning; this is the only file-system access here.

    ``depends`` (a dict), when given, receives {path: path_signature} of what the
    records were read from, each signature taken before the read: the video root, the
    folders the videos' paths were made in (class folders; one listing each for video
    files) and each video counted from disk.  While they all match, records built
    again would be the same.

    ``count``: path -> frame count or None, for the entries without a segment in
    place of the count from disk (a shard index's, datasets/shards.py).
    """
    if subset not in SUBSETS:
        raise DataError(f"subset must be one of {SUBSETS}, got {subset!r}")
    if file_type not in FILE_TYPES:
        raise DataError(f"file_type must be one of {FILE_TYPES}, got {file_type!r}")
    data = read_annotation(annotation_path)
    class_names = _class_names(data, annotation_path)
    database = data['database']
    video_path = Path(video_path) if video_path is not None else Path('.')
    _note(depends, video_path)
    if _is_activitynet(dataset):
        records = _activitynet_records(data, database, class_names, annotation_path, subset,
                                       video_path, file_type, depends)
    elif dataset.lower() in STANDARD_DATASETS:
        records = _standard_records(database, class_names, annotation_path, subset,
                                    video_path, file_type, depends, count)
    else:
        raise DataError(f"unknown dataset {dataset!r}: expected one of "
                        f"{STANDARD_DATASETS + ('activitynet',)}")
    return records, class_names


def _note(depends: dict | None, path) -> None:
    if depends is not None and str(path) not in depends:
        depends[str(path)] = path_signature(path)


def _standard_records(database, class_names, path, subset, video_path, file_type, depends=None,
                      count=None):
    class_ids = {name: i for i, name in enumerate(class_names)}
    suffix = _suffixer(file_type, depends)
    records = []
    skipped = 0
    for video_id, entry in database.items():
        if not isinstance(entry, dict) or entry.get('subset') != subset:
            continue
        ann = entry.get('annotations') or {}
        if not isinstance(ann, dict):
            raise DataError(f'video {video_id} in {path}: "annotations" is not an object with '
                            f'"label" and "segment" (an ActivityNet file? then use --dataset '
                            f'activitynet)')
        label_name = ann.get('label')
        if label_name is not None:
            if label_name not in class_ids:
                raise DataError(
                    f'video {video_id} in {path} has label {label_name!r}, which is not in '
                    f'the file\'s "labels" list: add it to "labels" or fix the entry')
            label = class_ids[label_name]
            default = suffix(video_path / label_name, video_id)
        else:
            label = -1
            default = suffix(video_path / 'test', video_id)
        vpath = _resolve(video_path, entry, default)
        segment = ann.get('segment')
        if segment is None:
            _note(depends, vpath)
            n = count(vpath) if count is not None else _count_frames(vpath, file_type)
            if n is None:
                skipped += 1
                continue
            segment = (1, n + 1) if file_type == 'jpg' else (0, n)  # hdf5/video: 0-based
        try:
            begin, end = int(segment[0]), int(segment[1])
        except (TypeError, ValueError, IndexError):
            raise DataError(f'video {video_id} in {path}: segment {segment!r} is not a pair '
                            f'of frame numbers [begin, end)') from None
        if end <= begin:
            raise DataError(
                f'video {video_id} in {path} has an empty segment [{begin}, {end}) (end must be '
                f'greater than begin): re-extract its frames and rebuild the annotation, or '
                f'remove the entry')
        first = begin if begin == 0 else begin - 1
        records.append(VideoRecord(video_id, vpath, first, end - begin, label, (begin, end)))
    if skipped:
        warnings.warn(f"{path}: skipped {skipped} entries of subset '{subset}' that have no "
                      f"segment and no video on disk", stacklevel=3)
    if not records:
        raise _empty_subset_error(path, subset, database, skipped)
    return records


def _suffixer(file_type: str, depends: dict | None = None):
    """(folder, video_id) -> path of the video: jpg folder, .hdf5 file, or the video
    file of that name with one of VIDEO_EXTENSIONS (one listing per folder, DataError
    when two files share the name; '.mp4' when none has it, which check_videos then
    reports).  Each folder goes into ``depends`` (load_annotations)."""
    if file_type in ('jpg', 'hdf5'):
        suffix = '' if file_type == 'jpg' else '.hdf5'

        def frames_path(folder: Path, video_id: str) -> Path:
            _note(depends, folder)
            return folder / f'{video_id}{suffix}'
        return frames_path
    listings: dict[Path, dict[str, str]] = {}

    def video_file(folder: Path, video_id: str) -> Path:
        if folder not in listings:
            _note(depends, folder)  # before the listing: a change after it shows next time
            listings[folder] = video_files(folder)
        return folder / listings[folder].get(video_id, f'{video_id}{VIDEO_EXTENSIONS[0]}')
    return video_file


def _count_frames(vpath: str, file_type: str):
    """Frame count of a video on disk (only for entries without a segment), None if absent."""
    try:
        return frame_count(vpath, file_type)
    except OSError:  # missing, a folder, not hdf5
        return None


def _activitynet_records(data, database, class_names, path, subset, video_path, file_type,
                         depends=None):
    """One record per annotated segment (frame number = floor(seconds * fps) + 1,
    1-based); segments shorter than 8 frames are dropped.  Testing entries (no
    annotations) give one record for the whole video, whose length is the
    entry's ``n_frames`` if present, else floor(duration * fps)."""
    class_ids = {name: i for i, name in enumerate(class_names)}
    suffix = _suffixer(file_type, depends)
    records = []
    for video_id, entry in database.items():
        if not isinstance(entry, dict) or entry.get('subset') != subset:
            continue
        vpath = _resolve(video_path, entry, suffix(video_path, f'v_{video_id}'))
        if 'fps' not in entry:
            raise DataError(f'video {video_id} in {path} has no "fps": add it with the '
                            f'ActivityNet preparation script (util_scripts) after extracting '
                            f'frames')
        fps = float(entry['fps'])
        n_video = entry.get('n_frames')
        if n_video is None and 'duration' in entry:
            n_video = math.floor(float(entry['duration']) * fps)
        annotations = entry.get('annotations') or []
        if not annotations:
            if n_video is None:
                raise DataError(f'video {video_id} in {path} has neither "n_frames" nor '
                                f'"duration": cannot tell its length')
            if n_video >= 1:
                records.append(VideoRecord(video_id, vpath, 0, int(n_video), -1,
                                           (1, int(n_video) + 1)))
            continue
        for ann in annotations:
            label_name = ann.get('label')
            if label_name not in class_ids:
                raise DataError(f'video {video_id} in {path} has label {label_name!r}, which '
                                f'is not a leaf of the taxonomy: fix the entry')
            begin = math.floor(float(ann['segment'][0]) * fps) + 1
            end = math.floor(float(ann['segment'][1]) * fps) + 1
            if n_video is not None:
                end = min(end, int(n_video) + 1)
            if end - begin < ACTIVITYNET_MIN_FRAMES:
                continue
            records.append(VideoRecord(video_id, vpath, begin - 1, end - begin,
                                       class_ids[label_name], (begin, end)))
    if not records:
        raise _empty_subset_error(path, subset, database)
    return records
