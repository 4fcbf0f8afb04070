"""Write a data set's videos as WebDataset-style tar shards plus an index
(datasets/shards.py describes the format), for reading from a local folder,
HTTP or S3.

python -m util_scripts.make_shards ANNOTATION VIDEO_ROOT OUT --file_type jpg|hdf5|video
    [--dataset kinetics|ucf101|hmdb51|mit|activitynet|synthetic] [--shard_size 1GB]
    [--workers N] [--no_progress]
    [--reencode [--gop 16] [--short_side 320] [--codec libx264] [--crf 23]]

Every video that an entry of ANNOTATION names (all subsets; a video named by
several entries, as ActivityNet's segments are, once) is read from VIDEO_ROOT as
the training loader finds it with --file_type: a video file or an hdf5 file is
copied unchanged, a jpg frame folder packed into hdf5 bytes as
util_scripts/generate_video_hdf5 packs it (so the shards hold 'video' or 'hdf5'
payloads).  OUT/shard-000000.tar, ... are filled in the order of the videos'
paths up to --shard_size each (1GB, 500MB, 64KB, 2GiB or a number of bytes;
KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024), then OUT/index.json and
OUT/index.npz written.  The same input gives byte-identical files, whatever
--workers (the processes that read and pack the videos; the order is kept).

--reencode (with --file_type video): each video is re-encoded, in the worker, as
util_scripts/reencode_videos re-encodes it (a keyframe every --gop frames, the
short side at most --short_side, 0: kept; --codec, --crf; every frame kept in
order, its count checked) into a temporary file (removed after) and its bytes
stored as <KEY>.mp4, with the re-encoded frame count.  The encoder runs on one
thread, as x264's bytes depend on its thread count: the shards are the same on
every machine.  A video that cannot be re-encoded is left out like an unreadable
one.

Each shard is written as shard-NNNNNN.tar.tmp and renamed when complete; after
each one OUT/.make_shards.json records the finished shards (name, size, sha256)
and the videos left out so far.  Run the same command again after an
interruption: the finished shards whose sha256 still matches are kept as they
are and the run goes on with the next; a video left out before that is tried
again, and if it can now be read the shards from its position on are rewritten.
The shards are not compared with the videos again: after changing videos
(not the annotation or the --reencode settings, which are compared), delete OUT
first.

A video that cannot be read (missing, no frames, a gap in its frames, an
unreadable hdf5 file, a video file whose frames cannot be counted, an entry
without a segment whose video is missing) is left out and named in the
summary, and the command exits with status 1 once the others are written.
Bad arguments, a missing or invalid annotation: one line "error: ...", exit
status 2.  As a command it parses its arguments before the heavy imports.
"""
# ruff: noqa: E402 -- the imports after the command-line parse are meant to be there
import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import warnings
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from utils.cli import Parser

DATASETS = ('kinetics', 'ucf101', 'hmdb51', 'mit', 'activitynet', 'synthetic')
REENCODE_OPTIONS = (('gop', int, 16), ('short_side', int, 320), ('codec', str, 'libx264'), ('crf', int, 23))
_SIZE = re.compile(r'^\s*(\d+(?:\.\d*)?)\s*(?:([kmgt])(i?)b?|b)?\s*$', re.IGNORECASE)


def parse_size(text):
    """Bytes of '1GB', '500MB', '64KB', '2GiB', '4096' (argparse type)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f'{text!r} is no size: give e.g. 1GB, 500MB, 64KB or a number of bytes')
    number, unit, binary = match.groups()
    scale = (1024 if binary else 1000) ** ('kmgt'.index(unit.lower()) + 1) if unit else 1
    size = int(float(number) * scale)
    if size < 1:
        raise argparse.ArgumentTypeError(f'{text!r}: the shard size must be at least 1 byte')
    return size


def parse_args(argv):
    p = Parser(prog='python -m util_scripts.make_shards',
               description='Write the videos of an annotation file as tar shards (WebDataset layout) '
                           'with an index, for reading from a folder, HTTP or S3.')
    p.add_argument('annotation', type=Path, metavar='ANNOTATION', help='annotation file (.json)')
    p.add_argument('video_root', type=Path, metavar='VIDEO_ROOT',
                   help='the videos: <label>/<video_id>/image_*.jpg, <label>/<video_id>.hdf5 or '
                        '<label>/<video_id>.mp4 (...), as --video_path of training')
    p.add_argument('out', type=Path, metavar='OUT', help='folder of the shards and index (created)')
    p.add_argument('--file_type', choices=['jpg', 'hdf5', 'video'], default='jpg',
                   help='how the videos under VIDEO_ROOT are stored (as training\'s --file_type)')
    p.add_argument('--dataset', default='kinetics', choices=DATASETS,
                   help='the annotation\'s format: activitynet, or the others\' labels + database')
    p.add_argument('--shard_size', type=parse_size, default='1GB',
                   help='largest shard (a larger video gets a shard of its own)')
    p.add_argument('--workers', type=int, default=1,
                   help='processes reading and packing the videos')
    p.add_argument('--no_progress', action='store_true', help='no progress bar on stderr')
    p.add_argument('--reencode', action='store_true',
                   help='re-encode each video (--file_type video) as util_scripts.reencode_videos does')
    for option, kind, default in REENCODE_OPTIONS:
        p.add_argument(f'--{option}', type=kind,
                       help=f"with --reencode: reencode_videos' --{option} (default {default})")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f'--workers must be at least 1, got {args.workers}')
    given = [f'--{o}' for o, _, _ in REENCODE_OPTIONS if getattr(args, o) is not None]
    if args.reencode and args.file_type != 'video':
        p.error(f'--reencode re-encodes video files: it needs --file_type video, not {args.file_type}')
    if given and not args.reencode:
        p.error(f'{", ".join(given)} given without --reencode: add --reencode, or leave them out')
    for option, _, default in REENCODE_OPTIONS:
        if getattr(args, option) is None:
            setattr(args, option, default)
    if not args.annotation.is_file():
        p.error(f'annotation file {args.annotation} not found')
    if not args.video_root.is_dir():
        p.error(f'VIDEO_ROOT {args.video_root} is not a folder')
    if args.out.exists() and not args.out.is_dir():
        p.error(f'OUT {args.out} exists and is not a folder')
    return args


if __name__ == '__main__':
    COMMAND_LINE = parse_args(None)

from multiprocessing import Pool

from tqdm import tqdm

from datasets import shards
from datasets.annotation import SUBSETS, load_annotations, read_annotation
from datasets.formats import HDF5_RGB_KEYS, frame_count, frame_file_name, frame_numbers
from utils.atomic import write_atomic
from utils.errors import DataError, OptionError
from utils.progress import on_terminal

from .reencode_videos import check_options, reencode_video
from .utils import contiguous_frames, fail

PAYLOAD_TYPES = {'jpg': 'hdf5', 'hdf5': 'hdf5', 'video': 'video'}  # input file_type -> the payloads'
WINDOW = 4  # videos being prepared ahead, per worker (bounds the payloads held in memory)
COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class Video:
    rel: str  # REL: relative to VIDEO_ROOT, a file's extension removed
    source: str  # the folder or file read
    ext: str  # the payload member's extension
    label: str | None
    subsets: tuple[str, ...]


def usage_error(message):
    print(f'error: {message}', file=sys.stderr, flush=True)
    sys.exit(2)


# ---------------------------------------------------------------- the videos

def subset_records(annotation, subset, video_root, dataset, file_type):
    """load_annotations' records of one subset; [] when none of its entries gives one
    (every entry without segment and video: they are then named as missing)."""
    try:
        with warnings.catch_warnings():  # its count of skipped entries: they are named here
            warnings.simplefilter('ignore', UserWarning)
            return load_annotations(annotation, subset, video_root, dataset, file_type)
    except DataError as e:
        if str(e).startswith(f"subset '{subset}' of "):  # no videos (datasets.annotation._empty_subset_error)
            return [], None
        raise


def collect_videos(annotation, video_root, dataset, file_type):
    """(videos sorted by REL, failures [(name, why)] found while reading the annotation)."""
    database = read_annotation(annotation)['database']
    present = {e.get('subset') for e in database.values() if isinstance(e, dict)}
    videos, failures = {}, []
    for subset in (s for s in SUBSETS if s in present):
        records, class_names = subset_records(annotation, subset, video_root, dataset, file_type)
        for r in records:
            try:
                rel = shards.relative_path(r.path, video_root, file_type)
            except ValueError:
                failures.append((r.path, f'not under VIDEO_ROOT {video_root} (a "video_path" in the annotation)'))
                continue
            label = class_names[r.label] if r.label >= 0 else None
            known = videos.get(rel)
            if known is None:
                videos[rel] = Video(rel, r.path, shards.payload_ext(r.path, file_type), label, (subset,))
            elif known.source != r.path:
                failures.append((r.path, f'has the same name {rel} as {known.source}'))
            elif subset not in known.subsets:
                videos[rel] = Video(rel, known.source, known.ext, known.label, known.subsets + (subset,))
        if dataset != 'activitynet':
            failures += unread_entries(database, subset, {r.video_id for r in records})
    return [videos[rel] for rel in sorted(videos)], failures


def unread_entries(database, subset, read_ids):
    """Entries of ``subset`` that load_annotations skipped (no segment, no video on disk)."""
    return [(f"{(e.get('annotations') or {}).get('label') or 'test'}/{video_id}",
             'no segment in the annotation and no video on disk')
            for video_id, e in database.items()
            if isinstance(e, dict) and e.get('subset') == subset and video_id not in read_ids]


# ---------------------------------------------------------------- payloads

def hdf5_image(frames):
    """The bytes of the hdf5 file util_scripts/generate_video_hdf5.write_hdf5 writes for
    the JPEG byte strings ``frames`` (built in memory: HDF5's core driver)."""
    import h5py
    import numpy as np
    data = np.empty(len(frames), dtype=object)
    for i, jpeg in enumerate(frames):
        data[i] = np.frombuffer(jpeg, dtype=np.uint8)
    with h5py.File('in-memory.hdf5', 'w', driver='core', backing_store=False) as h5:
        h5.create_dataset(HDF5_RGB_KEYS[0], data=data, dtype=h5py.vlen_dtype(np.uint8))
        h5.flush()
        return h5.id.get_file_image()


def jpg_payload(folder):
    """(hdf5 bytes, n_frames) of a frame folder, or a str saying why not."""
    numbers = frame_numbers(folder)
    n = contiguous_frames(numbers)
    if n == 0:
        return 'no frames (no image_00001.jpg)' if not numbers else f'{frame_file_name(0)} is missing'
    if n != len(numbers):
        return f'{frame_file_name(n)} is missing (a gap in the frames): extract the video again'
    frames = []
    for i in range(n):
        with open(os.path.join(folder, frame_file_name(i)), 'rb') as f:
            frames.append(f.read())
    return hdf5_image(frames), n


def reencoded_payload(source, reencode):
    """(bytes, n_frames) of ``source`` re-encoded with the settings ``reencode``, through
    a temporary folder that is removed whatever happens; DataError naming ``source``."""
    with tempfile.TemporaryDirectory(prefix='make_shards-') as folder:
        path = os.path.join(folder, 'video.mp4')
        n = reencode_video(source, path, threads=1, **reencode)  # one thread: the same bytes anywhere
        with open(path, 'rb') as f:
            return f.read(), n


def prepare(job):
    """(payload bytes or None: copy the source, its size, n_frames, None) of one video,
    or (None, 0, 0, why it cannot be read).  Runs in the worker processes.  ``job``:
    (source, file_type, the --reencode settings or None)."""
    source, file_type, reencode = job
    try:
        if file_type == 'jpg':
            result = jpg_payload(source)
            if isinstance(result, str):
                return None, 0, 0, result
            return result[0], len(result[0]), result[1], None
        if not os.path.isfile(source):
            return None, 0, 0, f'missing ({source})'
        if reencode is not None:
            payload, n = reencoded_payload(source, reencode)
            return payload, len(payload), n, None
        n = frame_count(source, file_type)
        if not n:
            return None, 0, 0, 'no frames' if n == 0 else "no 'video' dataset"
        return None, os.path.getsize(source), n, None
    except FileNotFoundError:
        return None, 0, 0, f'missing ({source})'
    except (OSError, DataError) as e:
        return None, 0, 0, str(e) or type(e).__name__


def prepared(videos, start, workers, file_type, reencode=None):
    """(position, video, prepare's result) from ``start`` on, in order; ``workers``
    processes, at most WINDOW per worker ahead of the writer."""
    jobs = ((i, videos[i]) for i in range(start, len(videos)))
    if workers == 1:
        for i, video in jobs:
            yield i, video, prepare((video.source, file_type, reencode))
        return
    with Pool(workers) as pool:
        window = deque()
        for i, video in jobs:
            window.append((i, video, pool.apply_async(prepare, ((video.source, file_type, reencode),))))
            if len(window) >= WINDOW * workers:
                i, video, result = window.popleft()
                yield i, video, result.get()
        while window:
            i, video, result = window.popleft()
            yield i, video, result.get()


# ---------------------------------------------------------------- shards

class ShardWriter:
    """One shard being written to <name>.tmp (renamed by close), its sha256 and rows."""

    def __init__(self, out, number):
        self.name = shards.shard_name(number)
        self.number, self.path = number, out / self.name
        self.tmp = out / (self.name + '.tmp')
        self.file = open(self.tmp, 'wb')
        self.sha = hashlib.sha256()
        self.offset, self.rows = 0, []

    def _write(self, data):
        self.file.write(data)
        self.sha.update(data)
        self.offset += len(data)

    def _member(self, name, size, data=None, source=None):
        """Write a member (data, or ``size`` bytes copied from ``source``); its data's offset."""
        self._write(shards.tar_header(name, size))
        start = self.offset
        if data is not None:
            self._write(data)
        else:
            with open(source, 'rb') as f:
                while chunk := f.read(min(COPY_CHUNK, size - (self.offset - start))):
                    self._write(chunk)
        if self.offset - start != size:
            raise DataError(f'{source} changed while it was copied ({self.offset - start} bytes, not {size})')
        self._write(shards.block_padding(size))
        return start

    def add(self, video, payload, size, meta):
        key = shards.escape_key(video.rel)
        offset = self._member(f'{key}.{video.ext}', size, payload, video.source)
        meta_offset = self._member(f'{key}.json', len(meta), meta)
        self.rows.append({'path': video.rel, 'ext': video.ext, 'shard': self.number, 'offset': offset,
                          'size': size, 'meta_offset': meta_offset, 'meta_size': len(meta),
                          'n_frames': json.loads(meta)['n_frames']})

    def close(self):
        """Finish the archive, rename it into place; its index.json entry."""
        self._write(shards.archive_end(self.offset))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return {'name': self.name, 'size': self.offset, 'sha256': self.sha.hexdigest(),
                'members': 2 * len(self.rows), 'n_videos': len(self.rows)}


def member_span(name, size):
    return len(shards.tar_header(name, size)) + size + len(shards.block_padding(size))


def video_span(video, size, meta):
    key = shards.escape_key(video.rel)
    return member_span(f'{key}.{video.ext}', size) + member_span(f'{key}.json', len(meta))


def save_progress(out, progress):
    """Rewrite OUT/.make_shards.json (atomically) after a finished shard."""
    write_atomic(out / shards.PROGRESS_NAME, (json.dumps(progress, sort_keys=True, indent=1) + '\n').encode())


def fingerprint(videos, file_type, shard_size, reencode=None):
    """What the shards depend on besides the videos' bytes: a finished shard of a run
    with another fingerprint is not taken up."""
    plan = {'version': shards.VERSION, 'file_type': file_type, 'shard_size': shard_size,
            **({'reencode': reencode} if reencode is not None else {}),  # absent: earlier runs' fingerprints hold
            'videos': [[v.rel, v.ext, v.label, list(v.subsets)] for v in videos]}
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- resuming

def read_progress(out, print_fn=print):
    path = out / shards.PROGRESS_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        print_fn(f'{path} unreadable ({e}): starting over')
        return None


def resume_point(out, videos, file_type, shard_size, reencode=None, print_fn=print):
    """(kept shard entries, their rows, failures [(position, name, why)], next position)
    from OUT's progress file: the leading finished shards whose size and sha256 still
    match, cut before the first earlier failure that can now be read."""
    progress = read_progress(out, print_fn)
    if not progress or progress.get('fingerprint') != fingerprint(videos, file_type, shard_size, reencode):
        return [], [], [], 0
    kept = []
    for entry in progress['shards']:
        path = out / entry['name']
        if not path.is_file() or path.stat().st_size != entry['size'] or shards.file_sha256(path) != entry['sha256']:
            print_fn(f'{path} is not the shard written before: writing it again')
            break
        kept.append(entry)
    nxt = kept[-1]['next'] if kept else 0
    failures = [tuple(f) for f in progress['failures'] if f[0] < nxt]
    for position, name, _ in failures:
        if prepare((videos[position].source, file_type, reencode))[3] is None:
            print_fn(f'{name} can be read now: writing the shards from its position on again')
            kept = [e for e in kept if e['next'] <= position]
            nxt = kept[-1]['next'] if kept else 0
            failures = [f for f in failures if f[0] < nxt]
            break
    rows = []
    for i, entry in enumerate(kept):
        rows += shards.read_shard_rows(out / entry['name'], i)
    return kept, rows, failures, nxt


# ---------------------------------------------------------------- the run

@dataclass
class Run:
    out: Path
    videos: list
    file_type: str  # the input's
    shard_size: int
    shards: list
    rows: list
    failures: list  # (position, name, why)
    reencode: dict | None = None  # reencode_video's settings

    def progress(self, nxt):
        return {'format': 'make-shards-progress', 'shard_size': self.shard_size,
                'fingerprint': fingerprint(self.videos, self.file_type, self.shard_size, self.reencode),
                'shards': self.shards, 'failures': [list(f) for f in self.failures], 'next': nxt}

    def finish(self, writer, nxt):
        entry = writer.close()
        entry['next'] = nxt
        self.shards.append(entry)
        self.rows += writer.rows
        save_progress(self.out, self.progress(nxt))


def write_shards(run, start, workers, bar):
    """Write the videos from position ``start`` on, into shards after run.shards."""
    payload_type = PAYLOAD_TYPES[run.file_type]
    writer = None
    try:
        results = prepared(run.videos, start, workers, run.file_type, run.reencode)
        for position, video, (payload, size, n_frames, error) in results:
            bar.update(1)
            if error is not None:
                run.failures.append((position, video.rel, error))
                continue
            meta = shards.meta_bytes(video.rel, video.label, video.subsets, n_frames, payload_type)
            span = video_span(video, size, meta)
            if writer is not None and writer.rows and \
                    shards.archive_size(writer.offset + span) > run.shard_size:
                run.finish(writer, position)
                writer = None
            if writer is None:
                writer = ShardWriter(run.out, len(run.shards))
            writer.add(video, payload, size, meta)
        if writer is not None and writer.rows:
            run.finish(writer, len(run.videos))
            writer = None
    finally:
        if writer is not None:
            writer.file.close()


def write_index(run):
    """index.npz then index.json, each atomically; shard files of earlier runs that are
    not in the index removed."""
    json_bytes, npz_bytes = shards.encode_index(PAYLOAD_TYPES[run.file_type], run.shards, run.rows)
    for name, data in ((shards.INDEX_NPZ, npz_bytes), (shards.INDEX_JSON, json_bytes)):
        write_atomic(run.out / name, data)
    names = {s['name'] for s in run.shards}
    for path in run.out.iterdir():
        if shards.is_shard_file(path.name) and path.name not in names:
            path.unlink()


def remove_index(out):
    for name in (shards.INDEX_JSON, shards.INDEX_NPZ):
        (out / name).unlink(missing_ok=True)


def report(run, early_failures):
    """The summary; exit status 1 when videos were left out."""
    total = sum(s['size'] for s in run.shards)
    print(f'{len(run.rows)} video(s) written to {len(run.shards)} shard(s) ({total:,} bytes) in {run.out}, '
          f'file_type {PAYLOAD_TYPES[run.file_type]}')
    failures = early_failures + [(name, why) for _, name, why in run.failures]
    if failures:
        print(f'{len(failures)} video(s) left out:', file=sys.stderr)
        for name, why in failures:
            print(f'  {name}: {why}', file=sys.stderr)
        fail(f'{len(failures)} video(s) could not be read (listed above); the others were written')


def main(argv=None, command_line=None):
    args = command_line if command_line is not None else parse_args(argv)
    reencode = None
    if args.reencode:
        reencode = dict(gop=args.gop, short_side=args.short_side or None, codec=args.codec, crf=args.crf)
        try:
            check_options(**reencode)
        except OptionError as e:
            usage_error(str(e))
    try:
        videos, early_failures = collect_videos(args.annotation, args.video_root, args.dataset, args.file_type)
    except DataError as e:
        usage_error(str(e))
    if reencode is not None:
        videos = [replace(v, ext='mp4') for v in videos]
    args.out.mkdir(parents=True, exist_ok=True)
    kept, rows, failures, start = resume_point(args.out, videos, args.file_type, args.shard_size, reencode)
    if kept:
        print(f'taking up {len(kept)} finished shard(s) of an earlier run ({start} of {len(videos)} videos done)')
    if start < len(videos):
        remove_index(args.out)
    run = Run(args.out, videos, args.file_type, args.shard_size, kept, rows, failures, reencode)
    with tqdm(total=len(videos), initial=start, unit='video', disable=args.no_progress or not on_terminal(),
              file=sys.stderr, mininterval=1.0) as bar:
        try:
            write_shards(run, start, args.workers, bar)
        except (OSError, DataError) as e:  # a video changed or vanished while copied, the disk full, ...
            fail(f'{e}; the finished shards are kept: run the command again to go on')
    if not run.rows:
        fail(f'none of the {len(videos) + len(early_failures)} videos could be written: '
             + '; '.join(f'{n}: {w}' for n, w in (early_failures + [f[1:] for f in run.failures])[:5]))
    save_progress(run.out, run.progress(len(videos)))
    write_index(run)
    report(run, early_failures)


if __name__ == '__main__':
    main(command_line=COMMAND_LINE)
