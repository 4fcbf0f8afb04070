"""Whether training from tar shards (util_scripts.make_shards) keeps up with the
files: clips/s through the training DataLoader from jpg folders, hdf5 files,
local shards and the same shards over HTTP (--shard_cache cold and warm), and
the start-up of a Kinetics-sized shard index.

    python -m bench.shards [--videos 64] [--frames 48] [--size 320x240] [--workers 4]
        [--rounds 3] [--seed 1] [--frame_kind photo|noise] [--no_video]
        [--shard_size 1GB] [--index_videos 650000]

The videos (generated in a temporary folder, 4 classes, a ucf101-style
annotation): --frame_kind photo, camera-like frames (bench/loading_frames.py's
photo_frames: scikit-image's photographs panned and zoomed; its noise frames
when scikit-image is missing, and the output says so), written as jpg folders
(simplejpeg, quality 90 for photo, 95 for noise, 4:2:0 chroma); hdf5 files from
them by util_scripts.generate_video_hdf5; shards of the jpg folders by
util_scripts.make_shards (hdf5 payloads: the same bytes as the hdf5 files);
unless --no_video, H.264 .mp4 files of the same frames (PyAV, x264 preset
medium, CRF 23) and their shards.

Every row is the training set as main.py builds it for a plain run (dataset.py's
video_store, get_training_data and make_train_loader on the options' defaults:
TemporalRandomCrop of 16 frames, random resized crop to 112 + flip, normalized
in the workers; --check_frames last, untimed): batch 8, --workers workers
(not persistent: they start afresh each epoch, as in training), each sample
drawn under its seed (--seed, epoch 0: every epoch of every row loads the same
clips). A row's clips/s is an epoch's clips over its wall time from iter()
(the workers' start included) to the last batch, the best of --rounds rounds
after a warm-up round (the rows interleaved in each round, in an order rotated
from round to round). The warm-up epochs also hash every batch: a row from the
jpg folders' bytes must load exactly the jpg folders' clips, the .mp4 shards
exactly the .mp4 files' ("same clips" column).

remote: the shard folder served by Python's http.server with byte ranges
(tests/servers.py's RangeHandler, in a process of its own on this machine: it
shares the CPU with the workers), read as --video_path http://127.0.0.1:PORT
with --shard_cache: cold is the first epoch over an empty cache folder (a new
one each round), warm the second epoch over the same cache. The HTTP column
counts the requests the server answered during the epoch and the bytes it sent
(the index is read before it). A clip from shards reads its video's whole
payload (one ranged read of the member), one from an hdf5 file the clip's frames.

index: a generated index.json/index.npz of --index_videos videos (no shards
behind it) and a matching Kinetics-like annotation (700 classes, 90% training):
(a) ShardStore(folder).index() in a new store (the files just written: in the
OS page cache), (a') the same over HTTP, (b) load_record_table of the training
subset with shards= the index, the first time (builds the record cache), (c) the
second time (reads it); (d) check_videos of those records against the index
(--check_frames all, training's default: part of every start-up) the first time
and (e) the second (its result cached).  The goal is a start-up with the caches:
(a) + (c) + (e). Figures are wall time on this machine; other processes share it.
"""
import argparse
import contextlib
import hashlib
import http.server
import importlib.util
import io
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

import dataset as data
from bench.loading_frames import FORMATS, QUALITY, disk_mb, encode_photo_jpeg, frames_of, photo_frames
from datasets import shards
from datasets.frame_check import check_videos
from datasets.storage import ShardStore
from datasets.video_index import load_record_table
from opts import option_defaults
from tests.servers import RangeHandler
from util_scripts import generate_video_hdf5, make_shards

LABELS = ('brushing', 'jumping', 'running', 'waving')
BATCH = 8
CLIP, SIZE = 16, 112
GOAL_REMOTE = 0.9  # remote at least 90% of local shards
GOAL_STARTUP_S = 2.0  # (c) + (a)
ROWS = {  # row: (what, its data, the row whose clips it must equal)
    'jpg': ('jpg folders', 'jpg', None),
    'hdf5': ('hdf5 files (generate_video_hdf5)', 'hdf5', 'jpg'),
    'shards': ('local shards (make_shards of the jpg folders)', 'shards', 'jpg'),
    'remote_cold': ('the shards over HTTP, --shard_cache cold (first epoch)', 'shards', 'jpg'),
    'remote_warm': ('the shards over HTTP, --shard_cache warm (second epoch)', 'shards', 'jpg'),
    'mp4': ('H.264 .mp4 files', 'mp4', None),
    'mp4_shards': ('local shards of the .mp4 files', 'mp4_shards', 'mp4'),
}


# ---------------------------------------------------------------- the videos

def frame_kind(asked):
    """(the frames used, a note): photo needs scikit-image, else noise frames."""
    if asked == 'photo' and importlib.util.find_spec('skimage') is None:
        return 'noise', "scikit-image is missing: bench/loading_frames.py's noise frames instead of photo frames"
    names = {'photo': "camera-like: scikit-image's photographs panned and zoomed (bench/loading_frames.py)",
             'noise': "blocks of colour plus per-pixel noise (bench/loading_frames.py's noise frames)"}
    return asked, names[asked]


def video_names(n_videos):
    """(label, video id) of each generated video."""
    return [(LABELS[v % len(LABELS)], f'video_{v:04d}') for v in range(n_videos)]


def _mp4_writer(path, size):
    import av
    codec, options = FORMATS['mp4']
    container = av.open(str(path), 'w')
    stream = container.add_stream(codec, rate=25, options=options)
    stream.width, stream.height, stream.pix_fmt = size[1], size[0], 'yuv420p'
    return container, stream


def write_videos(root, n_videos, n_frames, size, kind, mp4=True):
    """root/jpg/<label>/<id>/image_*.jpg (and root/mp4/<label>/<id>.mp4) of the
    generated frames (size: (height, width)), and root/annotation.json (ucf101)."""
    import av
    rng = np.random.default_rng(0)
    database = {}
    for v, (label, video_id) in enumerate(video_names(n_videos)):
        folder = root / 'jpg' / label / video_id
        folder.mkdir(parents=True)
        writer = None
        if mp4:
            (root / 'mp4' / label).mkdir(parents=True, exist_ok=True)
            writer = _mp4_writer(root / 'mp4' / label / f'{video_id}.mp4', size)
        frames = photo_frames(v, n_frames, size) if kind == 'photo' else frames_of(v, n_frames, size, rng)
        for f, img in enumerate(frames):
            (folder / f'image_{f + 1:05d}.jpg').write_bytes(encode_photo_jpeg(img, QUALITY[kind]))
            if writer is not None:
                writer[0].mux(writer[1].encode(av.VideoFrame.from_ndarray(img, format='rgb24')))
        if writer is not None:
            writer[0].mux(writer[1].encode())
            writer[0].close()
        database[video_id] = {'subset': 'training', 'annotations': {'label': label, 'segment': [1, n_frames + 1]}}
    annotation = root / 'annotation.json'
    annotation.write_text(json.dumps({'labels': list(LABELS), 'database': database}))
    return annotation


@contextlib.contextmanager
def quiet():
    """The tools' summaries and progress bars kept back; shown if they fail."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            yield
    except BaseException:
        sys.stderr.write(out.getvalue())
        raise


def prepare(root, args, kind):
    """The videos in every stored form: {data: its folder}, the annotation."""
    h, w = args.size
    annotation = write_videos(root, args.videos, args.frames, (h, w), kind, mp4=not args.no_video)
    folders = {'jpg': root / 'jpg', 'hdf5': root / 'hdf5', 'shards': root / 'shards'}
    common = ['--dataset', 'ucf101', '--no_progress', '--workers', '2', '--shard_size', args.shard_size]
    with quiet():
        generate_video_hdf5.main([str(folders['jpg']), str(folders['hdf5']), 'ucf101', '--n_jobs', '2'])
        make_shards.main([str(annotation), str(folders['jpg']), str(folders['shards']), '--file_type', 'jpg',
                          *common])
        if not args.no_video:
            folders['mp4'], folders['mp4_shards'] = root / 'mp4', root / 'mp4_shards'
            make_shards.main([str(annotation), str(folders['mp4']), str(folders['mp4_shards']),
                              '--file_type', 'video', *common])
    return folders, annotation


# ---------------------------------------------------------------- the HTTP server

class CountingHandler(RangeHandler):
    """tests/servers.py's byte-range handler, counting the requests it answers and
    the bytes it sends (counter: [requests, bytes])."""

    def __init__(self, *args, counter, **kwargs):
        self.counter = counter
        super().__init__(*args, **kwargs)

    def send_head(self):
        f = super().send_head()
        sent = 0 if f is None else getattr(self, '_remaining', None)
        if sent is None:  # a whole file
            sent = os.fstat(f.fileno()).st_size
        with self.counter.get_lock():
            self.counter[0] += 1
            self.counter[1] += sent
        return f


def _serve(folder, counter, conn):
    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), partial(CountingHandler, directory=str(folder), counter=counter))
    conn.send(server.server_address[1])
    server.serve_forever(poll_interval=0.05)


@contextlib.contextmanager
def range_server(folder):
    """(http://127.0.0.1:PORT serving ``folder`` with byte ranges, its counter of
    [requests, bytes sent]), the server in a process of its own (not this one's GIL)."""
    mp = multiprocessing.get_context('fork')  # started before any loader: no thread of ours to inherit
    counter = mp.Array('q', 2)
    parent, child = mp.Pipe()
    process = mp.Process(target=_serve, args=(folder, counter, child), daemon=True)
    process.start()
    try:
        if not parent.poll(30):
            raise RuntimeError('the HTTP server did not start')
        yield f'http://127.0.0.1:{parent.recv()}', counter
    finally:
        process.terminate()
        process.join()


# ---------------------------------------------------------------- the training loader

FILE_TYPES = {'jpg': 'jpg', 'hdf5': 'hdf5', 'mp4': 'video'}  # --file_type (shards: their index's)


def training_options(root, video_path, file_type, annotation, args, shard_cache=None):
    """main.py's options for a plain run on these videos (the parser's defaults)."""
    options = option_defaults()
    options.update(dataset='ucf101', video_path=video_path, annotation_path=annotation, file_type=file_type,
                   result_path=root / 'results', sample_size=SIZE, sample_duration=CLIP,
                   batch_size=BATCH, n_threads=args.workers, manual_seed=args.seed, check_frames='last',
                   shard_cache=shard_cache)
    return argparse.Namespace(**options)


def train_loader(root, data_name, folders, annotation, args, shard_cache=None, url=None):
    """The training loader of ``folders[data_name]`` (or of the shards at ``url``) as
    main.py builds it (CPU, one process): its batches (clips, targets)."""
    video_path = url or folders[data_name]
    opt = training_options(root, video_path, FILE_TYPES.get(data_name, 'jpg'), annotation, args, shard_cache)
    file_type, store = data.video_store(opt, video_path)
    record = SimpleNamespace(annotation_path=annotation, video_path=video_path, file_type=file_type,
                             shards=store, n_classes=None, normalize_on_device=False,
                             decode_on_device=False, resume_path=None)
    train, _ = data.get_training_data(opt, record)
    ctx = SimpleNamespace(world_size=1, rank=0, local_rank=0, distributed=False, device=torch.device('cpu'))
    return data.make_train_loader(train, opt, ctx)


def epoch(loader, check=False, counter=None):
    """{clips, seconds, requests, sent (bytes), digests} of one epoch of ``loader``
    (digests of every batch with ``check``: outside the timing)."""
    before = list(counter) if counter is not None else None
    digests, clips = [], 0
    start = time.perf_counter()
    for batch, targets in loader:
        clips += len(batch)
        if check:
            digests.append(hashlib.sha256(batch.numpy().tobytes() + targets.numpy().tobytes()).hexdigest())
    seconds = time.perf_counter() - start
    if check:  # hashing time is not loading time: the check epochs are not timed
        seconds = float('nan')
    after = list(counter) if counter is not None else None
    return {'clips': clips, 'seconds': seconds, 'digests': digests,
            'requests': after[0] - before[0] if after else None, 'sent': after[1] - before[1] if after else None}


def local_case(loader):
    return lambda check: [epoch(loader, check)]


def remote_case(root, url, folders, annotation, args, counter):
    """Two epochs over the served shards with a new, empty --shard_cache: cold, warm."""
    rounds = iter(range(10 ** 6))

    def run(check):
        cache = root / 'shard_cache' / str(next(rounds))
        loader = train_loader(root, 'shards', folders, annotation, args, shard_cache=cache, url=url)
        cold = epoch(loader, check, counter)
        cold['cache_mb'] = disk_mb(cache)
        warm = epoch(loader, check, counter)
        warm['cache_mb'] = disk_mb(cache)
        shutil.rmtree(cache, ignore_errors=True)
        return [cold, warm]
    return run


def measure(cases, rounds):
    """{row: its epochs of ``rounds`` (seconds, clips), the warm-up epoch's digests and counts}."""
    results = {}
    for rows, run in cases:  # the warm-up round: the clips checked
        for row, res in zip(rows, run(True)):
            results[row] = {**res, 'seconds': [], 'warmup_clips': res['clips'], 'round_clips': []}
    for k in range(rounds):
        shift = k % len(cases)
        for rows, run in cases[shift:] + cases[:shift]:
            for row, res in zip(rows, run(False)):
                r = results[row]
                r['seconds'].append(res['seconds'])
                r['round_clips'].append(res['clips'])
                r['requests'], r['sent'] = res['requests'], res['sent']  # the last round's
                if 'cache_mb' in res:
                    r['cache_mb'] = res['cache_mb']
    return results


def loader_rows(root, folders, annotation, args):
    """The table's rows: dicts with row, what, clips/s, MB, requests, clips, same clips."""
    local = [name for name in ('jpg', 'hdf5', 'shards', 'mp4', 'mp4_shards') if name in folders]
    cases = [((name,), local_case(train_loader(root, name, folders, annotation, args))) for name in local]
    with range_server(folders['shards'].parent) as (url, counter):
        served = f'{url}/{folders["shards"].name}'
        cases.insert(3, (('remote_cold', 'remote_warm'), remote_case(root, served, folders, annotation, args, counter)))
        results = measure(cases, args.rounds)
    rows = []
    for row in (r for r in ROWS if r in results):
        what, stored, reference = ROWS[row]
        res = results[row]
        same = None if reference is None else res['digests'] == results[reference]['digests']
        rates = [n / t for n, t in zip(res['round_clips'], res['seconds'])]
        rows.append({'row': row, 'what': what, 'clips_per_s': max(rates), 'rounds': rates,
                     'mb': disk_mb(folders[stored]), 'cache_mb': res.get('cache_mb'),
                     'requests': res['requests'], 'sent_mb': None if res['sent'] is None else res['sent'] / 1e6,
                     'clips': res['warmup_clips'],
                     'round_clips': res['round_clips'], 'same_clips': same, 'reference': reference})
    hdf5 = next(r['clips_per_s'] for r in rows if r['row'] == 'hdf5')
    for r in rows:
        r['vs_hdf5'] = r['clips_per_s'] / hdf5
    return rows


# ---------------------------------------------------------------- the index

def write_big_index(folder, annotation, n_videos, n_classes=700, per_shard=1000):
    """index.json/index.npz of ``n_videos`` videos in shards of ``per_shard`` (no
    shard files) and a matching Kinetics-like annotation (90% training)."""
    rng = random.Random(0)
    labels = [f'class {i:03d} doing something' for i in range(n_classes)]
    alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_'
    database, videos = {}, []
    n_train = n_videos * 9 // 10
    for i in range(n_videos):
        start = rng.randrange(600)
        video_id = ''.join(rng.choices(alphabet, k=11)) + f'_{start:06d}_{start + 10:06d}'
        label, n_frames = labels[i % n_classes], rng.randrange(200, 301)
        database[video_id] = {'subset': 'training' if i < n_train else 'validation',
                              'annotations': {'label': label, 'segment': [1, n_frames + 1]}}
        videos.append((f'{label}/{video_id}', n_frames))
    annotation.write_text(json.dumps({'labels': labels, 'database': database}))
    videos.sort()
    rows, offset = [], 0
    for i, (rel, n_frames) in enumerate(videos):
        if i % per_shard == 0:
            offset = 0
        size = 20_000 * n_frames
        rows.append({'path': rel, 'ext': 'hdf5', 'shard': i // per_shard, 'offset': offset + 1024,
                     'size': size, 'meta_offset': offset + 1536 + -(-size // 512) * 512, 'meta_size': 120,
                     'n_frames': n_frames})
        offset = rows[-1]['meta_offset'] + 512
    n_shards = -(-n_videos // per_shard)
    entries = [{'name': shards.shard_name(s), 'size': 0, 'sha256': hashlib.sha256(b'%d' % s).hexdigest(),
                'members': 2 * min(per_shard, n_videos - s * per_shard),
                'n_videos': min(per_shard, n_videos - s * per_shard)} for s in range(n_shards)]
    json_bytes, npz_bytes = shards.encode_index('hdf5', entries, rows)
    folder.mkdir(parents=True)
    (folder / shards.INDEX_NPZ).write_bytes(npz_bytes)
    (folder / shards.INDEX_JSON).write_bytes(json_bytes)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def index_startup(root, n_videos):
    """{step: seconds, ...} of a Kinetics-sized shard index's start-up."""
    folder, annotation = root / 'big_index', root / 'big_annotation.json'
    root.mkdir(parents=True, exist_ok=True)
    write_big_index(folder, annotation, n_videos)
    store = ShardStore(folder)  # the run's one store: its index read once
    index, a = _timed(store.index)
    with range_server(root) as (url, _):
        remote, a_http = _timed(lambda: ShardStore(f'{url}/{folder.name}').index())
    assert len(remote) == len(index) == n_videos
    cache = root / 'index_results' / 'data_index'
    args = (annotation, 'training', str(folder), 'kinetics', 'hdf5', cache)
    (table, _, cached_b), b = _timed(lambda: load_record_table(*args, shards=index))
    (table, _, cached_c), c = _timed(lambda: load_record_table(*args, shards=index))
    check = root / 'index_results' / 'frame_check'
    _, d = _timed(lambda: check_videos(table, 'hdf5', mode='all', store=store, cache_dir=check))
    _, e = _timed(lambda: check_videos(table, 'hdf5', mode='all', store=store, cache_dir=check))
    return {'videos': n_videos, 'records': len(table), 'a': a, 'a_http': a_http, 'b': b, 'c': c, 'd': d, 'e': e,
            'cached_b': cached_b, 'cached_c': cached_c, 'json_mb': annotation.stat().st_size / 1e6,
            'npz_mb': (folder / shards.INDEX_NPZ).stat().st_size / 1e6}


# ---------------------------------------------------------------- the output

def print_rows(rows, args, kind, note):
    h, w = args.size
    print(f'\n{args.videos} videos of {args.frames} frames, {w}x{h}, frames: {kind} ({note}); training set as '
          f'main.py builds it (TemporalRandomCrop {CLIP}, random resized crop to {SIZE} + flip, normalized), '
          f'DataLoader batch {BATCH}, {args.workers} workers (not persistent), seed {args.seed}; clips/s: an '
          f'epoch, workers\' start included, best of {args.rounds} after a warm-up; MB: file sizes; '
          f'{torch.get_num_threads()} torch threads, {os.cpu_count()} cores')
    print('| row | data | clips/s | vs hdf5 files | every round (clips/s) | MB | HTTP requests, MB sent '
          '| clips an epoch | same clips |')
    print('|---|---|---:|---:|---:|---:|---:|---:|---|')
    for i, r in enumerate(rows, 1):
        mb = f'{r["mb"]:.1f}' + (f' + {r["cache_mb"]:.1f} cache' if r['cache_mb'] is not None else '')
        same = '(reference)' if r['reference'] is None else \
            (f'= {r["reference"]}' if r['same_clips'] else f'DIFFERENT from {r["reference"]}')
        requests = '' if r['requests'] is None else f'{r["requests"]}, {r["sent_mb"]:.1f}'
        rounds = ' / '.join(f'{rate:.1f}' for rate in r['rounds'])
        print(f'| {i} | {r["what"]} | {r["clips_per_s"]:.1f} | {r["vs_hdf5"]:.2f}x | {rounds} | {mb} | {requests} | '
              f'{r["clips"]} | {same} |')


def print_index(ix):
    print(f'\nshard index start-up: {ix["videos"]} videos (index.npz {ix["npz_mb"]:.1f} MB, annotation '
          f'{ix["json_mb"]:.0f} MB JSON), training subset {ix["records"]} records')
    print('| step | seconds |')
    print('|---|---:|')
    for key, what in (('a', '(a) ShardStore(folder).index(), a new store'),
                      ('a_http', "(a') ShardStore(http://...).index(), a new store"),
                      ('b', '(b) load_record_table(..., shards=index), first time (builds the record cache)'),
                      ('c', '(c) load_record_table(..., shards=index), second time (the record cache)'),
                      ('d', '(d) check_videos(--check_frames all) against the index, first time'),
                      ('e', '(e) the same again (its result cached)')):
        print(f'| {what} | {ix[key]:.2f} |')


def goals(rows, ix, workers):
    """[(goal, figure, met)]."""
    rate = {r['row']: r['clips_per_s'] for r in rows}
    out = [('local shards at least as fast as hdf5 files', f'{rate["shards"] / rate["hdf5"]:.2f}x',
            rate['shards'] >= rate['hdf5'])]
    for row in ('remote_cold', 'remote_warm'):
        ratio = rate[row] / rate['shards']
        out.append((f'remote ({row[7:]} cache, {workers} workers; goal stated for 4) at least '
                    f'{GOAL_REMOTE:.0%} of local shards', f'{ratio:.0%}', ratio >= GOAL_REMOTE))
    if ix is not None:
        total = ix['a'] + ix['c'] + ix['e']
        out.append((f'index start-up with the cache, (a) + (c) + (e) <= {GOAL_STARTUP_S:g} s',
                    f'{total:.2f} s (without the caches (a) + (b) + (d): {ix["a"] + ix["b"] + ix["d"]:.2f} s)',
                    total <= GOAL_STARTUP_S))
    return out


def print_goals(met):
    print('\ngoals (the issue\'s)')
    print('| goal | figure | met? |')
    print('|---|---:|---|')
    for goal, figure, ok in met:
        print(f'| {goal} | {figure} | {"yes" if ok else "no"} |')


def _size(text):
    try:
        w, h = (int(x) for x in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r}: give WIDTHxHEIGHT, e.g. 320x240') from None
    return h, w


def parse_args(argv):
    p = argparse.ArgumentParser(prog='python -m bench.shards', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--videos', type=int, default=64, help='generated videos (at least the batch, 8)')
    p.add_argument('--frames', type=int, default=48, help='frames a video (at least 16)')
    p.add_argument('--size', type=_size, default=(240, 320), help='WIDTHxHEIGHT of the frames')
    p.add_argument('--frame_kind', choices=['photo', 'noise'], default='photo')
    p.add_argument('--workers', type=int, default=4, help='DataLoader workers (--n_threads)')
    p.add_argument('--rounds', type=int, default=3, help='timed epochs a row (the best counts)')
    p.add_argument('--seed', type=int, default=1, help='--manual_seed')
    p.add_argument('--shard_size', default='1GB', help="make_shards' --shard_size")
    p.add_argument('--no_video', action='store_true', help='no .mp4 rows')
    p.add_argument('--index_videos', type=int, default=650_000, help='entries of the index (0: no index section)')
    args = p.parse_args(argv)
    if args.videos < BATCH or args.frames < CLIP or args.rounds < 1 or args.workers < 0 or args.index_videos < 0:
        p.error(f'--videos must be at least {BATCH}, --frames at least {CLIP}, --rounds at least 1, '
                '--workers and --index_videos at least 0')
    return args


def main(argv=None):
    """Prints the tables; returns {'frames', 'rows', 'index', 'goals'}."""
    args = parse_args(argv)
    kind, note = frame_kind(args.frame_kind)
    # more workers than cores is the point of the remote rows (they wait on the network)
    warnings.filterwarnings('ignore', message='This DataLoader will create', category=UserWarning)
    with tempfile.TemporaryDirectory(prefix='bench_shards_') as tmp:
        root = Path(tmp)
        folders, annotation = prepare(root / 'videos', args, kind)
        rows = loader_rows(root / 'videos', folders, annotation, args)
        print_rows(rows, args, kind, note)
        ix = index_startup(root / 'index', args.index_videos) if args.index_videos else None
        if ix is not None:
            print_index(ix)
    met = goals(rows, ix, args.workers)
    print_goals(met)
    return {'frames': kind, 'rows': rows, 'index': ix, 'goals': met}


if __name__ == '__main__':
    main()
