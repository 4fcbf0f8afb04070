"""bench/data_loading.py's index section: a generated Kinetics-700-sized annotation,
the start-up time of the list of VideoRecords against the cached RecordTable, and
the memory a forked worker dirties reading every entry."""
import gc
import json
import os
import random
import time

from datasets.annotation import load_annotations
from datasets.video_index import load_record_table


def private_dirty_mb() -> float:
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            if line.startswith('Private_Dirty:'):
                return int(line.split()[1]) / 1024
    return float('nan')


def dirtied_by_worker(records) -> float:
    """MB of copy-on-write memory a forked worker dirties reading every record."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: read every entry as a data set's __getitem__ would
        os.close(read)
        before = private_dirty_mb()
        for i in range(len(records)):
            r = records[i]
            r.path, r.n_frames, r.label  # noqa: B018 - reading is the point
        os.write(write, f'{private_dirty_mb() - before:.3f}'.encode())
        os._exit(0)
    os.close(write)
    result = float(os.read(read, 64))
    os.waitpid(pid, 0)
    os.close(read)
    return result


def write_kinetics_like(path, n_train, n_val, n_classes=700):
    rng = random.Random(0)
    labels = [f'class {i:03d} doing something' for i in range(n_classes)]
    alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_'
    database = {}
    for i in range(n_train + n_val):
        start = rng.randrange(600)
        video_id = ''.join(rng.choices(alphabet, k=11)) + f'_{start:06d}_{start + 10:06d}'
        database[video_id] = {'subset': 'training' if i < n_train else 'validation',
                              'annotations': {'label': labels[i % n_classes],
                                              'segment': [1, rng.randrange(200, 301)]}}
    with open(path, 'w') as f:
        json.dump({'labels': labels, 'database': database}, f)


def index_rows(root, n_entries):
    """Start-up time and per-worker dirtied memory: VideoRecord list vs RecordTable."""
    annotation = root / 'kinetics_like.json'
    n_train = n_entries * 9 // 10
    write_kinetics_like(annotation, n_train, n_entries - n_train)
    args = (annotation, 'training', '/data/kinetics/jpg', 'kinetics')
    rows = []
    start = time.perf_counter()
    records, _ = load_annotations(*args)
    rows.append(('list of VideoRecord (load_annotations)', time.perf_counter() - start,
                 dirtied_by_worker(records), len(records)))
    del records
    gc.collect()
    for label in ('RecordTable, first start (builds the cache)', 'RecordTable, cached start'):
        start = time.perf_counter()
        table, _, _ = load_record_table(*args, cache_dir=root / 'results')
        rows.append((label, time.perf_counter() - start, dirtied_by_worker(table), len(table)))
        del table
        gc.collect()
    size = annotation.stat().st_size / 1e6
    print(f'\nannotation index: {n_entries} entries ({size:.0f} MB JSON), training subset')
    print('| index | start-up (s) | dirtied per worker (MB) | records |')
    print('|---|---:|---:|---:|')
    for label, seconds, dirtied, n in rows:
        print(f'| {label} | {seconds:.2f} | {dirtied:.1f} | {n} |')
