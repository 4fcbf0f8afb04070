"""Helpers shared by the data-preparation scripts in util_scripts/.

Only these scripts use this module; the training code has its own loaders.
"""
import json
import os
import shutil
import subprocess
import sys
from multiprocessing.pool import Pool, ThreadPool
from pathlib import Path

from datasets.annotation import hdf5_frame_count

# Containers ffmpeg reads that show up in the supported datasets' archives.
VIDEO_EXTS = {'.mp4', '.avi', '.webm', '.mkv', '.mov', '.m4v', '.flv',
              '.mpg', '.mpeg', '.3gp', '.wmv', '.ogv'}

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


def n_jobs_value(n_jobs):
    # joblib convention kept from the predecessor: -1 means every core.
    if n_jobs is None or n_jobs <= 0:
        return os.cpu_count() or 1
    return n_jobs


def parallel_map(func, items, n_jobs, processes=False):
    """Yield func(item) for every item, in completion order.

    Threads suit jobs that wait on a subprocess (ffmpeg); processes suit
    jobs that hold the h5py lock. n_jobs == 1 runs inline, which keeps
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
        yield from pool.imap_unordered(func, items)


def run_conversions(jobs, func, n_jobs, processes=False):
    """Run conversion jobs (func(job) -> (source, status, message)), print
    progress and failures, and exit non-zero if any failed."""
    counts = {'converted': 0, 'skipped': 0, 'failed': 0}
    for folder in {job[1].parent for job in jobs}:
        folder.mkdir(parents=True, exist_ok=True)
    step = max(1, len(jobs) // 100)
    for i, (source, status, message) in enumerate(
            parallel_map(func, jobs, n_jobs, processes), 1):
        counts[status] += 1
        if status == 'failed':
            print(f'failed: {source}: {message}', file=sys.stderr)
        if i % step == 0 or i == len(jobs):
            print(f'[{i}/{len(jobs)}] {source.name}: {status}', flush=True)
    print(f'{counts["converted"]} converted, {counts["skipped"]} already '
          f'done, {counts["failed"]} failed')
    if counts['failed']:
        fail(f'{counts["failed"]} video(s) failed; rerun to retry them '
             '(finished ones are skipped)')
    return counts


def write_json(path, data):
    """Write JSON through a temporary file so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + '.tmp')
    with tmp.open('w') as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_lines(path):
    """Non-empty, stripped lines; the official split files use CRLF."""
    with open(path, 'r', encoding='utf-8-sig') as f:
        return [line.strip() for line in f if line.strip()]


def write_annotation(dst_json_path, labels, database):
    """Write one annotation JSON and say what went into it."""
    write_json(dst_json_path, {'labels': labels, 'database': database})
    counts = {}
    for entry in database.values():
        counts[entry['subset']] = counts.get(entry['subset'], 0) + 1
    summary = ', '.join(f'{n} {subset}' for subset, n in counts.items())
    print(f'{dst_json_path}: {len(labels)} labels, {summary or "no"} videos')


# ---------------------------------------------------------------- frames

def frame_numbers(video_dir):
    """Sorted frame numbers N of the image_N.jpg files in video_dir."""
    numbers = []
    with os.scandir(video_dir) as it:
        for entry in it:
            name = entry.name
            if name.startswith('image_') and name.endswith('.jpg'):
                try:
                    numbers.append(int(name[6:-4]))
                except ValueError:
                    continue
    numbers.sort()
    return numbers


def contiguous_frames(numbers):
    """Number of frames 1..k present without a gap (numbers sorted)."""
    k = 0
    for n in numbers:
        if n != k + 1:
            break
        k = n
    return k


def hdf5_n_frames(path):
    """Frames in an hdf5 video file, or None when it has no frame dataset."""
    import h5py  # only needed for hdf5 data; keeps jpg-only runs light
    with h5py.File(path, 'r') as f:
        return hdf5_frame_count(f)


# Why video_segment() gives no usable segment, or truncates one.
PROBLEMS = {
    'missing': 'not found, skipped',
    'empty': 'without frames, skipped',
    'unreadable': "unreadable or without a 'video' dataset, skipped",
    'gap': 'with a missing frame, segment cut before the gap',
}


def video_segment(video_root, label_dir, video_id, video_type=None):
    """Return (segment, problem) for one video on disk.

    jpg folders give the 1-based [1, n + 1], hdf5 files the 0-based [0, n]
    (data_formats.md). video_type None looks for a folder first, then a
    .hdf5 file. problem is None or a key of PROBLEMS; segment is None
    when the video cannot be used at all.
    """
    base = os.path.join(video_root, label_dir, video_id)
    if video_type in (None, 'jpg') and os.path.isdir(base):
        numbers = frame_numbers(base)
        n = contiguous_frames(numbers)
        if n == 0:
            return None, 'empty'
        if n != len(numbers):
            # A gap would make the loader ask for a frame that is not
            # there; stop the segment before the first missing frame.
            return [1, n + 1], 'gap'
        return [1, n + 1], None
    if video_type in (None, 'hdf5') and os.path.isfile(base + '.hdf5'):
        try:
            n = hdf5_n_frames(base + '.hdf5')
        except OSError:
            n = None
        if n is None:
            return None, 'unreadable'
        if n == 0:
            return None, 'empty'
        return [0, n], None
    return None, 'missing'


def add_segments(database, video_root, video_type=None, max_listed=5):
    """Fill annotations['segment'] from the frames on disk.

    Videos that are missing or have no frames are dropped from database
    (the loader could not use them) and counted in a printed summary.
    Exits with an error when none is found, which almost always means a
    wrong video_path. Returns the number dropped.
    """
    problems = {}
    dropped = []
    for video_id, entry in database.items():
        annotations = entry['annotations']
        label_dir = annotations.get('label', TEST_FOLDER)
        segment, problem = video_segment(video_root, label_dir, video_id,
                                         video_type)
        if problem is not None:
            problems.setdefault(problem, []).append(f'{label_dir}/{video_id}')
        if segment is None:
            dropped.append(video_id)
        else:
            annotations['segment'] = segment
    for video_id in dropped:
        del database[video_id]

    for problem, names in problems.items():
        listed = ', '.join(names[:max_listed])
        if len(names) > max_listed:
            listed += f', ... ({len(names) - max_listed} more)'
        print(f'{len(names)} video(s) {PROBLEMS[problem]}: {listed}',
              file=sys.stderr)
    if not database and dropped:
        layout = {'jpg': '<label>/<video_id>/image_00001.jpg',
                  'hdf5': '<label>/<video_id>.hdf5'}.get(
                      video_type, '<label>/<video_id>/image_00001.jpg or '
                      '<label>/<video_id>.hdf5')
        fail(f'none of the {len(dropped)} listed videos was found under '
             f'{video_root}; expected {layout} there (test videos under '
             f'{TEST_FOLDER}/). Check video_path.')
    return len(dropped)


# ---------------------------------------------------------------- ffmpeg

def require_ffmpeg():
    path = shutil.which('ffmpeg')
    if path is None:
        fail('ffmpeg was not found on PATH. Install it (e.g. '
             '`apt-get install ffmpeg` or `conda install -c conda-forge '
             'ffmpeg`) and run again.')
    return path


def ffmpeg_command(video_path, out_pattern, fps=-1, size=240, threads=0):
    """ffmpeg arguments that write every frame as a quality-1 JPEG.

    The short side becomes `size` and the other keeps the aspect ratio,
    rounded to an even number (-2); size <= 0 keeps the original size.
    fps > 0 resamples with the fps filter (drops/duplicates frames).
    """
    filters = []
    if fps is not None and fps > 0:
        filters.append(f'fps={fps:g}')
    if size is not None and size > 0:
        filters.append(f"scale='if(gt(iw,ih),-2,{size})'"
                       f":'if(gt(iw,ih),{size},-2)'")
    cmd = ['ffmpeg', '-nostdin', '-hide_banner', '-loglevel', 'error', '-y',
           '-i', str(video_path)]
    if filters:
        cmd += ['-vf', ','.join(filters)]
    if threads > 0:
        cmd += ['-threads', str(threads)]
    cmd += ['-q:v', '1', str(out_pattern)]
    return cmd


def extract_frames(video_path, out_dir, fps=-1, size=240, threads=0):
    """Run ffmpeg into out_dir (created); return (n_frames, error_or_None)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = ffmpeg_command(video_path, out_dir / 'image_%05d.jpg', fps, size,
                         threads)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    except OSError as e:
        return 0, f'could not run ffmpeg: {e}'
    n = len(frame_numbers(out_dir))
    if proc.returncode != 0:
        tail = proc.stderr.decode('utf-8', 'replace').strip()[-500:]
        return n, f'ffmpeg exited with {proc.returncode}: {tail}'
    if n == 0:
        return 0, 'ffmpeg wrote no frame (no video stream?)'
    return n, None


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
    videos = []
    for rel, folder in folders:
        for f in sorted(folder.iterdir()):
            # Hidden files include macOS '._x.mp4' resource forks.
            if (f.is_file() and f.suffix.lower() in VIDEO_EXTS
                    and not f.name.startswith('.')):
                videos.append((rel, f))
    return videos
