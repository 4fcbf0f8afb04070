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

    from datasets.video import scan_frame_index
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
