"""Helpers shared by the data-preparation scripts in util_scripts/.

Only these scripts use this module; the training code has its own loaders.
"""
import json
import os
import sys
from multiprocessing.pool import Pool, ThreadPool
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from datasets.formats import (
    FILE_TYPES,
    VIDEO_EXTENSIONS,
    frame_count,
    frame_file_name,
    frame_numbers,
    video_files,
)
from datasets.whole_videos import count_frames, iter_frames
from utils.atomic import atomic_file
from utils.cli import Parser
from utils.errors import DataError
from utils.progress import on_terminal

VIDEO_EXTS = set(VIDEO_EXTENSIONS)

# ActivityNet keeps its videos in one flat folder, the others per class.
DATASETS = ('kinetics', 'mit', 'ucf101', 'hmdb51', 'activitynet')

# Entries without a label (test sets) keep their frames under this folder.
TEST_FOLDER = 'test'


def fail(message):
    """Stop a command-line tool with a message and exit status 1."""
    raise SystemExit('error: ' + message)


def require_file(path, what, hint=''):
    path = Path(path)
    if not path.is_file():
        fail(f'{what} not found: {path}' + (f' ({hint})' if hint else ''))
    return path


def require_dir(path, what, hint=''):
    path = Path(path)
    if not path.is_dir():
        fail(f'{what} is not a directory: {path}' +
             (f' ({hint})' if hint else ''))
    return path


def builder_parser(description, lists, lists_help, dst_help):
    """The annotation builders' command line: the official lists (``lists``:
    its name), the frames or videos whose frames are counted, where to write."""
    parser = Parser(description=description)
    parser.add_argument(lists, type=Path, help=lists_help)
    parser.add_argument('video_path', type=Path,
                        help='frame root: <label>/<video_id>/image_*.jpg, '
                        '<label>/<video_id>.hdf5 or video files <label>/'
                        '<video_id>.avi (.mp4, ...); used to count frames')
    parser.add_argument('dst_path', type=Path, help=dst_help)
    return parser


def parse_builder_args(argv, doc, lists_help, dst_help, lists_check):
    """A split-list builder's arguments (builder_parser's, the lists in
    'dir_path'; its description the first line of ``doc``), the lists' folder
    (lists_check: what it is, a hint) and the video root checked."""
    args = builder_parser(doc.split('\n')[0], 'dir_path', lists_help, dst_help).parse_args(argv)
    require_dir(args.dir_path, *lists_check)
    require_video_root(args.video_path)
    return args


def require_video_root(path):
    return require_dir(path, 'video_path',
                       'the frames (util_scripts.generate_video_jpgs) or the videos')


def require_known_labels(database, labels, what):
    """Stop when entries of the database name classes that are not in labels;
    ``what`` says which file lists the classes and which uses others."""
    unknown = sorted({v['annotations']['label'] for v in database.values()} - set(labels))
    if unknown:
        fail(f'{what}: {", ".join(unknown[:5])}')


def n_jobs_value(n_jobs):
    # joblib convention kept from the predecessor: -1 means every core.
    if n_jobs is None or n_jobs <= 0:
        return os.cpu_count() or 1
    return n_jobs


def parallel_map(func, items, n_jobs, processes=False, ordered=False):
    """Yield func(item) for every item, in completion order (or in order).

    Processes suit decoding and h5py (which holds a global lock); threads
    suit jobs that wait on I/O. n_jobs == 1 runs inline, which keeps
    tracebacks readable and lets tests run in-process.
    """
    items = list(items)
    n_jobs = min(n_jobs_value(n_jobs), max(len(items), 1))
    if n_jobs == 1:
        for item in items:
            yield func(item)
        return
    pool_cls = Pool if processes else ThreadPool
    with pool_cls(n_jobs) as pool:
        yield from (pool.imap if ordered else pool.imap_unordered)(func, items)


def run_conversions(jobs, func, n_jobs, processes=False, max_listed=None):
    """Run conversion jobs (func(job) -> (source, status, message)) under a
    progress bar, then print a summary naming every video that failed and
    why; exit non-zero if any failed."""
    counts = {'converted': 0, 'skipped': 0, 'failed': 0}
    failures = []
    for folder in {job[1].parent for job in jobs}:
        folder.mkdir(parents=True, exist_ok=True)
    results = parallel_map(func, jobs, n_jobs, processes)
    for source, status, message in tqdm(results, total=len(jobs),
                                         unit='video', mininterval=1.0, disable=not on_terminal()):
        counts[status] += 1
        if status == 'failed':
            failures.append(f'{source}: {message}')
    print(f'{counts["converted"]} converted, {counts["skipped"]} already '
          f'done, {counts["failed"]} failed')
    if failures:
        print(f'{len(failures)} video(s) failed:', file=sys.stderr)
        for line in failures[:max_listed]:
            print(f'  {line}', file=sys.stderr)
        fail(f'{len(failures)} video(s) failed (listed above); rerun to '
             'retry them (finished ones are skipped)')
    return counts


def write_json(path, data):
    """Write JSON through a temporary file so a crash never leaves half a file."""
    with atomic_file(path, 'w') as f:
        json.dump(data, f)


def read_lines(path):
    """Non-empty, stripped lines; the official split files use CRLF."""
    with open(path, 'r', encoding='utf-8-sig') as f:
        return [line.strip() for line in f if line.strip()]


def _keep_other_annotation(path: Path, annotation: dict) -> Path | None:
    """Renames the file at ``path`` to <stem>.previous.json when it differs from ``annotation``."""
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # nothing there, or nothing worth keeping
    if before == json.loads(json.dumps(annotation)):
        return None
    kept = path.with_name(f'{path.stem}.previous.json')
    os.replace(path, kept)
    return kept


def write_annotation(dst_json_path, labels, database):
    """Write one annotation JSON and say what went into it. An annotation already
    there with other contents (built from frame folders, now from the videos, say)
    is kept beside it as <name>.previous.json, and the line says so."""
    dst_json_path = Path(dst_json_path)
    annotation = {'labels': labels, 'database': database}
    kept = _keep_other_annotation(dst_json_path, annotation)
    write_json(dst_json_path, annotation)
    if kept is not None:
        print(f'note: {dst_json_path} held another annotation (built from other videos or frames?): '
              f'kept as {kept}')
    counts = {}
    for entry in database.values():
        counts[entry['subset']] = counts.get(entry['subset'], 0) + 1
    summary = ', '.join(f'{n} {subset}' for subset, n in counts.items())
    print(f'{dst_json_path}: {len(labels)} labels, {summary or "no"} videos')


# ---------------------------------------------------------------- frames

def contiguous_frames(numbers):
    """Number of frames 1..k present without a gap (numbers sorted)."""
    k = 0
    for n in numbers:
        if n != k + 1:
            break
        k = n
    return k


# Why video_segment() gives no usable segment, or truncates one.
PROBLEMS = {
    'missing': 'not found, skipped',
    'empty': 'without frames, skipped',
    'unreadable': "unreadable or without a 'video' dataset, skipped",
    'gap': 'with a missing frame, segment cut before the gap',
    'undecodable': 'that cannot be decoded, skipped',
}
VIDEO_TYPES = FILE_TYPES


def find_video_file(base, listings=None):
    """base + the extension of the video file of that name (.mp4, .avi, ...; in any
    case), found as the loader finds it (datasets.formats.video_files), or None;
    ``listings``: {folder: video_files(folder)} listed already."""
    folder, stem = os.path.split(base)
    if listings is not None and folder in listings:
        name = listings[folder].get(stem)
    else:
        name = video_files(folder or '.').get(stem)
    return os.path.join(folder, name) if name else None


def video_file_segment(path):
    """(segment, problem, how): 0-based [0, n] as for hdf5 (frame p is the
    p-th decoded frame); how says whether n came from the container header
    or from decoding (datasets.whole_videos.count_frames)."""
    try:
        n, how = count_frames(path)
    except DataError:
        return None, 'undecodable', None
    if n == 0:
        return None, 'empty', how
    return [0, n], None, how


def video_segment(video_root, label_dir, video_id, video_type=None, listings=None):
    """Return (segment, problem, how) for one video on disk.

    jpg folders give the 1-based [1, n + 1], hdf5 files and video files the
    0-based [0, n] (docs/data.md, File formats). video_type None looks for a folder,
    then a .hdf5 file, then a video file. problem is None or a key of
    PROBLEMS; segment is None when the video cannot be used at all; how is
    'container' or 'decoded' for video files, else None.
    """
    base = os.path.join(video_root, label_dir, video_id)
    if video_type in (None, 'jpg') and os.path.isdir(base):
        numbers = frame_numbers(base)
        n = contiguous_frames(numbers)
        if n == 0:
            return None, 'empty', None
        if n != len(numbers):
            # A gap would make the loader ask for a frame that is not
            # there; stop the segment before the first missing frame.
            return [1, n + 1], 'gap', None
        return [1, n + 1], None, None
    if video_type in (None, 'hdf5') and os.path.isfile(base + '.hdf5'):
        try:
            n = frame_count(base + '.hdf5', 'hdf5')
        except OSError:
            n = None
        if n is None:
            return None, 'unreadable', None
        if n == 0:
            return None, 'empty', None
        return [0, n], None, None
    if video_type in (None, 'video'):
        path = find_video_file(base, listings)
        if path is not None:
            return video_file_segment(path)
    return None, 'missing', None


def add_segments(database, video_root, video_type=None, max_listed=5):
    """Fill annotations['segment'] from the frames (or video files) on disk.

    Videos that are missing or have no frames are dropped from database
    (the loader could not use them) and counted in a printed summary.
    Exits with an error when none is found, which almost always means a
    wrong video_path. Returns the number dropped.
    """
    def measure(item):
        video_id, entry = item
        label_dir = entry['annotations'].get('label', TEST_FOLDER)
        return (video_id, label_dir,
                *video_segment(video_root, label_dir, video_id, video_type, listings))

    # one listing per folder, here: two videos of one name stop the tool in one line
    listings = {}
    if video_type in (None, 'video'):
        for folder in {os.path.join(video_root, e['annotations'].get('label', TEST_FOLDER))
                       for e in database.values()}:
            try:
                listings[folder] = video_files(folder)
            except DataError as e:
                fail(str(e))

    problems, dropped, counted = {}, [], {}
    # threads: counting frames of video files decodes them (FFmpeg runs
    # without the GIL), and stats on network file systems wait
    for video_id, label_dir, segment, problem, how in parallel_map(
            measure, list(database.items()), -1, ordered=True):
        if problem is not None:
            problems.setdefault(problem, []).append(f'{label_dir}/{video_id}')
        if how is not None:
            counted[how] = counted.get(how, 0) + 1
        if segment is None:
            dropped.append(video_id)
        else:
            database[video_id]['annotations']['segment'] = segment
    for video_id in dropped:
        del database[video_id]
    print_problems(problems, max_listed)
    if counted:
        print('frame counts of video files: ' + ', '.join(
            f'{n} {COUNT_SOURCES[how]}' for how, n in sorted(counted.items())))
    if not database and dropped:
        layout = {'jpg': '<label>/<video_id>/image_00001.jpg',
                  'hdf5': '<label>/<video_id>.hdf5',
                  'video': '<label>/<video_id>.mp4 (or .avi, ...)'}.get(
                      video_type, '<label>/<video_id>/image_00001.jpg, '
                      '<label>/<video_id>.hdf5 or <label>/<video_id>.mp4')
        fail(f'none of the {len(dropped)} listed videos was found under '
             f'{video_root}; expected {layout} there (test videos under '
             f'{TEST_FOLDER}/). Check video_path.')
    return len(dropped)


COUNT_SOURCES = {
    'container': 'from the container header (MP4/MOV: exact)',
    'decoded': 'by decoding every frame (AVI/WebM/MKV headers are not exact)'}


def print_problems(problems, max_listed):
    for problem, names in problems.items():
        listed = ', '.join(names[:max_listed])
        if len(names) > max_listed:
            listed += f', ... ({len(names) - max_listed} more)'
        print(f'{len(names)} video(s) {PROBLEMS[problem]}: {listed}',
              file=sys.stderr)


# ---------------------------------------------------------------- decoding

def extract_frames(video_path, out_dir, fps=-1, size=240, quality=95,
                   threads=0):
    """Decode video_path with PyAV (no ffmpeg binary) into out_dir (created)
    as image_00001.jpg, ...; return the number of frames.

    Every frame once, in order (fps > 0 resamples), upright, short side
    resized to `size` keeping the aspect ratio (size <= 0 keeps it).
    Raises DataError naming the file when it cannot be decoded.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    for n, jpeg in enumerate(encoded_frames(video_path, fps, size, quality,
                                            threads), 1):
        (out_dir / frame_file_name(n - 1)).write_bytes(jpeg)
    if n == 0:
        raise DataError(f'{video_path}: no frame decoded (no video frames?)')
    return n


def encoded_frames(video_path, fps=-1, size=240, quality=95, threads=0):
    """JPEG bytes of every frame of the video (see extract_frames)."""
    from torchvision.io import encode_jpeg
    for array in iter_frames(video_path, fps=fps if fps and fps > 0 else None,
                             short_side=size if size and size > 0 else None,
                             threads=threads):
        chw = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)
        yield encode_jpeg(chw, quality=quality).numpy().tobytes()


def list_videos(dir_path, dataset):
    """(relative folder, video file) pairs of the videos under dir_path.

    Class datasets keep <class>/<video>.<ext>; ActivityNet is flat.
    """
    dir_path = Path(dir_path)
    if dataset == 'activitynet':
        folders = [(Path(), dir_path)]
    else:
        folders = [(Path(d.name), d) for d in sorted(dir_path.iterdir())
                   if d.is_dir() and not d.name.startswith('.')]
        stray = [f for f in dir_path.iterdir()
                 if f.is_file() and f.suffix.lower() in VIDEO_EXTS]
        if stray:
            print(f'warning: {len(stray)} video file(s) directly in '
                  f'{dir_path} ignored; {dataset} expects '
                  f'<class>/<video> (use dataset activitynet for a flat '
                  f'folder)', file=sys.stderr)
    videos, others = [], []
    for rel, folder in folders:
        for f in sorted(folder.iterdir()):
            # Hidden files include macOS '._x.mp4' resource forks.
            if not f.is_file() or f.name.startswith('.'):
                continue
            if f.suffix.lower() in VIDEO_EXTS:
                videos.append((rel, f))
            else:
                others.append(str(rel / f.name))
    if others:
        listed = ', '.join(others[:5]) + (
            f', ... ({len(others) - 5} more)' if len(others) > 5 else '')
        print(f'note: {len(others)} file(s) that are not videos ignored: '
              f'{listed}', file=sys.stderr)
    return videos
