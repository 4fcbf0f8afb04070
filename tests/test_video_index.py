"""datasets/video_index.py: the compact record table and its cache."""
import json
import os

import numpy as np
import pytest

from datasets.annotation import VideoRecord, load_annotations
from datasets.video_index import RecordTable, load_record_table


def write_annotation(path, n, labels=('a', 'b', 'ü')):
    database = {f'vid_{i:04d}': {'subset': 'training' if i % 4 else 'validation',
                                 'annotations': {'label': labels[i % len(labels)],
                                                 'segment': [1 + i % 3, 20 + i]}}
                for i in range(n)}
    database['vid_0001']['video_path'] = '/elsewhere/x'  # absolute override
    database['t_0'] = {'subset': 'training', 'annotations': {}}  # no label, no segment
    path.write_text(json.dumps({'labels': list(labels), 'database': database}))
    return path


def test_table_gives_the_same_records(tmp_path):
    ann = write_annotation(tmp_path / 'a.json', 40)
    (tmp_path / 'v' / 'test' / 't_0').mkdir(parents=True)
    (tmp_path / 'v' / 'test' / 't_0' / 'image_00001.jpg').write_bytes(b'x')
    records, names = load_annotations(ann, 'training', tmp_path / 'v', 'kinetics')
    table, names2, cached = load_record_table(ann, 'training', tmp_path / 'v', 'kinetics')
    assert not cached and names2 == names == ['a', 'b', 'ü']
    assert len(table) == len(records) == 31
    assert list(table) == records
    assert table[-1] == records[-1] and table[3:5] == records[3:5]
    assert records[0].path == '/elsewhere/x' and table[0].path == '/elsewhere/x'
    assert table[-1].label == -1
    assert table.n_frames.dtype == np.int32 and table.label.dtype == np.int16
    with pytest.raises(IndexError):
        table[31]


def test_cache_is_used_and_invalidated(tmp_path):
    ann = write_annotation(tmp_path / 'a.json', 12)
    cache = tmp_path / 'results'
    args = (ann, 'validation', tmp_path / 'v', 'kinetics')
    first, _, cached = load_record_table(*args, cache_dir=cache)
    assert not cached and len(list(cache.glob('records_validation_*.npz'))) == 1
    again, names, cached = load_record_table(*args, cache_dir=cache)
    assert cached and list(again) == list(first) and names == ['a', 'b', 'ü']
    # another subset, video path or file type: another cache file
    _, _, cached = load_record_table(ann, 'validation', tmp_path / 'w', 'kinetics',
                                     cache_dir=cache)
    assert not cached
    # the annotation changes: rebuilt
    write_annotation(ann, 16)
    os.utime(ann, ns=(1, 1))
    changed, _, cached = load_record_table(*args, cache_dir=cache)
    assert not cached and len(changed) == 4
    # a damaged cache file is rebuilt, not fatal
    for f in cache.glob('records_validation_*.npz'):
        f.write_bytes(b'garbage')
    table, _, cached = load_record_table(*args, cache_dir=cache)
    assert not cached and list(table) == list(changed)


def test_from_records_round_trip(tmp_path):
    records = [VideoRecord('é', str(tmp_path / 'r' / 'c' / 'é'), 0, 5, 3, (0, 5)),
               VideoRecord('x', '/abs/x.hdf5', 7, 9, -1, (8, 17))]
    table = RecordTable.from_records(records, tmp_path / 'r')
    table.save(tmp_path / 't.npz', ['n'])
    loaded, names = RecordTable.load(tmp_path / 't.npz')
    assert list(loaded) == records and names == ['n']
    assert bytes(loaded.paths).startswith('c/'.encode())  # stored relative to the root


def test_data_sets_read_the_table_arrays(tmp_path):
    from datasets.temporal_transforms import SlidingWindow
    from datasets.videodataset import VideoClipDataset, VideoWindowDataset
    ann = write_annotation(tmp_path / 'a.json', 20)
    records, _ = load_annotations(ann, 'validation', tmp_path, 'kinetics')
    table, _, _ = load_record_table(ann, 'validation', tmp_path, 'kinetics')
    assert np.array_equal(VideoClipDataset(table, None).labels,
                          VideoClipDataset(records, None).labels)
    window = SlidingWindow(8, 4)
    a, b = VideoWindowDataset(table, None, window), VideoWindowDataset(records, None, window)
    assert np.array_equal(a.video_offsets, b.video_offsets) and len(a) == len(b) > len(records)
