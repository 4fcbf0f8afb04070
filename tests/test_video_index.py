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


# ----------------------------------------------------------------------------- FrameTable

def scanned_index(path):
    import av

    from datasets.frame_index import scan_frame_index
    with av.open(str(path)) as container:
        return scan_frame_index(container, container.streams.video[0])


def same_index(a, b) -> bool:
    arrays = ('key_pos', 'key_pts', 'key_seek')
    return (a.n_frames, a.truncated, a.expected) == (b.n_frames, b.truncated, b.expected) and \
        ((a.pts is None and b.pts is None) or np.array_equal(a.pts, b.pts)) and \
        all(np.array_equal(getattr(a, k), getattr(b, k)) for k in arrays)


@pytest.fixture(scope='module')
def four_videos(tmp_path_factory):
    """Regular timestamps (.avi), a variable frame rate (stored timestamps), frames an
    edit list hides, and a file cut short."""
    from tests.test_video import write_vfr
    from tests.video_files import write_coded_video, write_video
    folder = tmp_path_factory.mktemp('four')
    cut = write_video(folder / 'full.avi', n_frames=40, gop=5)
    (folder / 'cut.avi').write_bytes(cut.read_bytes()[:cut.stat().st_size * 3 // 4])
    return [write_video(folder / 'a.avi', n_frames=20, gop=5),
            write_vfr(folder / 'vfr.mp4', [40, 120, 40, 40, 120, 40]),
            write_coded_video(folder / 'edit.mp4', 'libx264', 30, {'g': '8'}, first_pts=-3),
            folder / 'cut.avi']


def test_frame_table_stores_what_the_scan_finds(four_videos, tmp_path):
    from datasets.video_index import FrameTable
    table = FrameTable(tmp_path)
    for path in four_videos:
        index, key = table.get(str(path))
        assert index is None and key is not None
        table.add(key, scanned_index(path))
    table.flush()
    assert len(list(tmp_path.glob('frames_*.npy'))) == 1
    again = FrameTable(tmp_path)  # another process's view
    assert len(again) == 4
    for path in four_videos:
        stored, _ = again.get(str(path))
        assert stored is not None and same_index(stored, scanned_index(path)), path.name
    flags = [again.get(str(p))[0] for p in four_videos]
    assert [f.truncated for f in flags] == [False, False, False, True]
    assert flags[2].n_frames == 27  # the 3 hidden frames have no position
    assert again.get(str(tmp_path / 'none.mp4')) == (None, None)


def test_the_index_is_built_once_reused_and_rebuilt_when_the_video_changes(tmp_path):
    from datasets.video import VideoClipLoader
    from datasets.video_index import FrameTable
    from tests.video_files import red_levels, write_video
    paths = [write_video(tmp_path / 'v' / f'{i}.mp4', n_frames=12 + i) for i in range(3)]
    first = VideoClipLoader(frame_table=FrameTable(tmp_path / 'frames'))
    for p in paths:
        first(p, [0])
    assert first.stats['scanned'] == 3 and 'stored' not in first.stats
    first.frame_table.flush()
    second = VideoClipLoader(frame_table=FrameTable(tmp_path / 'frames'))
    assert red_levels(second(paths[2], [13, 0, 7])) == [13, 0, 7]
    for p in paths[:2]:
        second(p, [1])
    assert second.stats.get('scanned', 0) == 0 and second.stats['stored'] == 3
    # one video replaced by a longer one: its stored index no longer applies
    write_video(paths[1], n_frames=30)
    third = VideoClipLoader(frame_table=FrameTable(tmp_path / 'frames'))
    assert red_levels(third(paths[1], [25, 29])) == [25, 29]
    third(paths[0], [0])
    assert third.stats['scanned'] == 1 and third.stats['stored'] == 1


def test_segments_are_merged_newest_first_and_damaged_ones_ignored(four_videos, tmp_path):
    from datasets.video_index import COMPACT_ABOVE, FrameTable
    for i in range(COMPACT_ABOVE + 2):  # one segment per "worker"
        table = FrameTable(tmp_path)
        path = four_videos[i % len(four_videos)]
        table.add(table.get(str(path))[1], scanned_index(path))
        table.flush()
    (tmp_path / 'frames_99999999999999999999_damaged.npy').write_bytes(b'garbage')
    assert len(FrameTable(tmp_path)) == COMPACT_ABOVE + 2  # the damaged one maps to nothing
    FrameTable(tmp_path).compact()
    assert len(list(tmp_path.glob('frames_*.npy'))) == 1
    merged = FrameTable(tmp_path)
    assert len(merged) == len(four_videos)
    for path in four_videos:
        assert same_index(merged.get(str(path))[0], scanned_index(path))


def test_a_merge_keeps_the_newest_index_of_a_video(four_videos, tmp_path):
    from datasets.video_index import COMPACT_ABOVE, FrameTable, path_hash
    h = path_hash('/v/x.mp4')
    old, new = scanned_index(four_videos[0]), scanned_index(four_videos[1])
    for i in range(COMPACT_ABOVE + 1):
        table = FrameTable(tmp_path)
        table.add((h, 1, 1) if i == 0 else (path_hash(f'/v/{i}.mp4'), 5, 5), old)
        table.flush()
    table = FrameTable(tmp_path)
    table.add((h, 2, 2), new)  # the video changed: written last
    table.flush()
    FrameTable(tmp_path).compact()
    merged = FrameTable(tmp_path)
    assert len(merged) == COMPACT_ABOVE + 1
    assert merged.lookup((h, 1, 1)) is None and same_index(merged.lookup((h, 2, 2)), new)
    assert same_index(merged.lookup((path_hash('/v/3.mp4'), 5, 5)), old)


def test_a_compaction_stops_where_another_rank_is_compacting(four_videos, tmp_path,
                                                                monkeypatch):
    """Ranks start at once and each calls compact(): one whose listed file vanished
    before it read it leaves the merge to the rank that removed it (before, it went on
    and could replace that rank's merged file with one lacking the vanished videos)."""
    import datasets.video_index as video_index
    from datasets.video_index import COMPACT_ABOVE, FrameTable
    for i in range(COMPACT_ABOVE + 1):
        table = FrameTable(tmp_path)
        table.add((i, 1, 1), scanned_index(four_videos[0]))
        table.flush()
    files = sorted(tmp_path.glob('frames_*.npy'))
    read = video_index._read_segment

    def other_rank_merged_first(path):
        files[0].unlink(missing_ok=True)
        return read(path)
    monkeypatch.setattr(video_index, '_read_segment', other_rank_merged_first)
    FrameTable(tmp_path).compact()
    assert sorted(tmp_path.glob('frames_*.npy')) == files[1:]  # nothing written, nothing removed


def test_a_compaction_of_damaged_segments_only_leaves_an_empty_table(tmp_path):
    from datasets.video_index import COMPACT_ABOVE, FrameTable
    for i in range(COMPACT_ABOVE + 1):
        (tmp_path / f'frames_{i:020d}_1_abcd.npy').write_bytes(b'not a segment')
    FrameTable(tmp_path).compact()  # raised ValueError (nothing to concatenate) before
    assert len(list(tmp_path.glob('frames_*.npy'))) == 1 and len(FrameTable(tmp_path)) == 0


# ----------------------------------------------------------------------------- what the record cache depends on

LONG_AGO = 10**18  # ns: data prepared long ago, so that a change made now shows in an mtime


def settle(*paths):
    for path in paths:
        os.utime(path, ns=(LONG_AGO, LONG_AGO))


def start_up(annotation, root, file_type, result):
    """The records of a start-up of main.py (dataset._record_table's call)."""
    table, _, cached = load_record_table(annotation, 'training', root, 'kinetics', file_type=file_type,
                                         cache_dir=result / 'data_index')
    return table, cached


def write_entries(path, entries):
    """A kinetics-format annotation of class 'cls': {video_id: segment or None}."""
    database = {v: {'subset': 'training',
                    'annotations': {'label': 'cls', **({'segment': s} if s else {})}}
                for v, s in entries.items()}
    path.write_text(json.dumps({'labels': ['cls'], 'database': database}))
    return path


def _rename(cls):
    os.rename(cls / 'a.avi', cls / 'a.mp4')


def _add(cls):
    (cls / 'c.webm').write_bytes(b'')


def _remove(cls):
    (cls / 'b.avi').unlink()


@pytest.mark.parametrize('change, expected', [(_rename, ['a.mp4', 'b.avi', 'c.mp4']),
                                              (_add, ['a.avi', 'b.avi', 'c.webm']),
                                              (_remove, ['a.avi', 'b.mp4', 'c.mp4'])])
def test_the_record_cache_sees_a_video_renamed_added_or_removed(tmp_path, change, expected):
    """A video file's extension comes from its class folder's listing: the cache keyed
    by the video root's mtime alone kept a.avi after a rename to a.mp4 ("not found" at
    every start-up until data_index/ was deleted)."""
    root, cls = tmp_path / 'v', tmp_path / 'v' / 'cls'
    cls.mkdir(parents=True)
    for name in ('a.avi', 'b.avi'):
        (cls / name).write_bytes(b'')  # not read: the segments are in the annotation
    annotation = write_entries(tmp_path / 'a.json', dict.fromkeys('abc', [0, 8]))
    settle(root, cls)
    names = [os.path.basename(r.path) for r in start_up(annotation, root, 'video', tmp_path)[0]]
    assert names == ['a.avi', 'b.avi', 'c.mp4']  # c: none on disk, the check reports it
    assert start_up(annotation, root, 'video', tmp_path)[1]  # unchanged: the cache is read
    change(cls)
    table, cached = start_up(annotation, root, 'video', tmp_path)
    assert not cached and [os.path.basename(r.path) for r in table] == expected
    assert start_up(annotation, root, 'video', tmp_path)[1]


@pytest.mark.parametrize('file_type', ['jpg', 'hdf5', 'video'])
def test_the_record_cache_sees_a_counted_video_replaced_or_added(tmp_path, file_type):
    """Entries without a segment are counted from disk: a video replaced by a longer
    one, or one that appears, changes the records (the cache kept the old ones)."""
    from tests.test_datasets import write_hdf5_video, write_jpg_video
    from tests.video_files import write_video

    def write(video_id, n):
        path = cls / {'jpg': video_id, 'hdf5': f'{video_id}.hdf5', 'video': f'{video_id}.mp4'}[file_type]
        {'jpg': write_jpg_video, 'hdf5': write_hdf5_video,
         'video': lambda p, n: write_video(p, n_frames=n)}[file_type](path, n)
        return path
    root, cls = tmp_path / 'v', tmp_path / 'v' / 'cls'
    a = write('a', 3)
    annotation = write_entries(tmp_path / 'a.json', {'a': None, 'b': None})
    settle(root, cls, a)
    with pytest.warns(UserWarning, match='skipped 1 entries'):  # b: not on disk
        table, _ = start_up(annotation, root, file_type, tmp_path)
    assert [(r.video_id, r.n_frames) for r in table] == [('a', 3)]
    write('a', 5)  # in place: a jpg folder's mtime, a file's size and mtime change
    write('b', 4)
    table, cached = start_up(annotation, root, file_type, tmp_path)
    assert not cached and [(r.video_id, r.n_frames) for r in table] == [('a', 5), ('b', 4)]
    assert start_up(annotation, root, file_type, tmp_path)[1]


def test_a_cache_of_another_format_version_is_not_read(tmp_path, monkeypatch):
    import datasets.video_index as video_index
    annotation = write_entries(tmp_path / 'a.json', {'a': [1, 9]})
    assert not start_up(annotation, tmp_path / 'v', 'jpg', tmp_path)[1]
    assert start_up(annotation, tmp_path / 'v', 'jpg', tmp_path)[1]
    monkeypatch.setattr(video_index, 'FORMAT_VERSION', video_index.FORMAT_VERSION + 1)
    assert not start_up(annotation, tmp_path / 'v', 'jpg', tmp_path)[1]


# ----------------------------------------------------------------------------- writers that race

def test_a_video_changed_during_a_run_keeps_its_newest_index_in_a_merge(four_videos, tmp_path):
    """One process that opens a video before and after it changed holds two indexes of
    it in one segment; the merge kept the first (the older)."""
    from datasets.video_index import COMPACT_ABOVE, FrameTable, path_hash
    h = path_hash('/v/x.mp4')
    old, new = scanned_index(four_videos[0]), scanned_index(four_videos[1])
    table = FrameTable(tmp_path)
    table.add((h, 1, 1), old)
    table.add((h, 2, 2), new)  # the same video, changed since
    table.flush()
    for i in range(COMPACT_ABOVE):
        table = FrameTable(tmp_path)
        table.add((path_hash(f'/v/{i}.mp4'), 5, 5), old)
        table.flush()
    FrameTable(tmp_path).compact()
    merged = FrameTable(tmp_path)
    assert len(merged) == COMPACT_ABOVE + 1
    assert merged.lookup((h, 1, 1)) is None and same_index(merged.lookup((h, 2, 2)), new)



@pytest.mark.parametrize('writer', ['record table', 'frame segment'])
def test_two_writers_with_one_pid_do_not_share_a_temporary_file(tmp_path, monkeypatch, writer):
    """Local rank 0 of two nodes often has the same PID (containers), and both write one
    shared result folder: the temporary file named by the PID alone was written by both,
    and the rename of the one that finished second found it gone."""
    import datasets.video_index as video_index
    target = tmp_path / 'data_index' / 'out.npy'

    def write(n):
        if writer == 'record table':
            records = [VideoRecord('v', '/x/v', 0, n, 0, (0, n))]
            RecordTable.from_records(records, '/x').save(target, ['c'])
        else:
            video_index._write_segment(target, {'x': np.arange(n)})

    def written():
        if writer == 'record table':
            return int(RecordTable.load(target)[0].n_frames[0])
        return len(video_index._read_segment(target)['x'])
    real = {name: getattr(np, name) for name in ('save', 'savez')}
    other_node = [2]  # frames the other node's table holds, written while this one writes

    def meanwhile(name):
        def save(*args, **kwargs):
            if other_node:
                write(other_node.pop())
            return real[name](*args, **kwargs)
        return save
    for name in real:
        monkeypatch.setattr(np, name, meanwhile(name))
    write(7)
    assert written() == 7 and sorted(p.name for p in target.parent.iterdir()) == ['out.npy']
