"""--check_frames: what each mode finds, the cache, and the short-video count."""
import shutil

import pytest

from datasets.annotation import VideoRecord
from datasets.frame_check import check_frames, check_videos, count_short_videos, needed_ranges
from tests.test_datasets import write_hdf5_video, write_jpg_video
from utils.errors import DataError


def record(folder, n, first=0, vid=None):
    return VideoRecord(vid or folder.name, str(folder), first, n, 0, (first + 1, first + n + 1))


@pytest.fixture
def videos(tmp_path):
    """good: 8 frames; hole: frame 3 missing (the last is there); empty: frame 2
    has zero bytes; corrupt: frame 5 is not a JPEG."""
    root = tmp_path / 'v'
    for name in ('good', 'hole', 'empty', 'corrupt'):
        write_jpg_video(root / name, 8)
    (root / 'hole' / 'image_00003.jpg').unlink()
    (root / 'empty' / 'image_00002.jpg').write_bytes(b'')
    (root / 'corrupt' / 'image_00005.jpg').write_bytes(b'not a jpeg')
    return {name: record(root / name, 8) for name in ('good', 'hole', 'empty', 'corrupt')}


def test_last_sees_only_the_last_frame(videos):
    check_videos(list(videos.values()), 'jpg', mode='last')


def test_all_finds_a_missing_frame_inside(videos):
    with pytest.raises(DataError) as info:
        check_videos(list(videos.values()), 'jpg', mode='all')
    msg = str(info.value)
    assert '1 of 4 videos' in msg and 'image_00003.jpg' in msg and videos['hole'].path in msg
    assert '--check_frames all' in msg


def test_decode_finds_empty_and_corrupt_frames(videos):
    problems = check_frames(needed_ranges([videos['good'], videos['empty'], videos['corrupt']]),
                            'decode')
    assert len(problems) == 2
    assert 'image_00002.jpg' in problems[0] and 'empty' in problems[0]
    assert 'image_00005.jpg' in problems[1] and 'corrupt' in problems[1]


def test_all_checks_only_the_segment(tmp_path):
    folder = write_jpg_video(tmp_path / 'v', 10)
    (folder / 'image_00001.jpg').unlink()  # position 0, outside the segment below
    assert check_frames(needed_ranges([record(folder, 6, first=2)]), 'all') == []
    problems = check_frames(needed_ranges([record(folder, 6, first=0)]), 'all')
    assert problems == [f'{folder}: 1 of the 6 frames it needs are missing (image_00001.jpg)']


def test_missing_folder_and_many_videos_on_the_pool(tmp_path):
    recs = []
    for i in range(100):
        folder = tmp_path / f'm{i}'
        if i != 63:
            write_jpg_video(folder, 2, size=8) if i == 0 else _empty_frames(folder, 2)
        recs.append(record(folder, 2))
    problems = check_frames(needed_ranges(recs), 'all', n_threads=4)
    assert problems == [f'{tmp_path / "m63"}: folder missing']


def _empty_frames(folder, n):
    folder.mkdir(parents=True)
    for p in range(n):
        (folder / f'image_{p + 1:05d}.jpg').touch()


def test_needed_ranges_merges_segments_of_one_video(tmp_path):
    a = VideoRecord('a', 'x', 0, 10, 0, (1, 11))
    b = VideoRecord('a', 'x', 5, 10, 0, (6, 16))
    c = VideoRecord('a', 'x', 30, 5, 0, (31, 36))
    assert needed_ranges([c, a, b]) == {'x': [(0, 15), (30, 35)]}


def test_clean_result_is_cached_and_a_failure_is_not(videos, tmp_path):
    cache = tmp_path / 'cache'
    good = needed_ranges([videos['good']])
    assert check_frames(good, 'all', cache_dir=cache) == []
    assert len(list(cache.glob('*.ok'))) == 1
    shutil.rmtree(videos['good'].path)
    assert check_frames(good, 'all', cache_dir=cache) == []  # answered by the cache
    assert check_frames(good, 'decode', cache_dir=cache) != []  # another mode: checked
    hole = needed_ranges([videos['hole']])
    assert check_frames(hole, 'all', cache_dir=cache) != []
    assert len(list(cache.glob('*.ok'))) == 1
    assert check_frames(hole, 'all', cache_dir=cache) != []  # still checked


def test_hdf5_all_reads_the_length_and_decode_decodes(tmp_path):
    path = write_hdf5_video(tmp_path / 'h' / 'ok.hdf5', 8)
    ok = VideoRecord('ok', str(path), 0, 8, 0, (0, 8))
    too_long = VideoRecord('ok', str(path), 2, 8, 0, (2, 10))
    check_videos([ok], 'hdf5', mode='all')
    with pytest.raises(DataError, match='needs 10 frames but has 8'):
        check_videos([too_long], 'hdf5', mode='all')
    assert check_frames({str(path): [(0, 8)]}, 'decode', 'hdf5') == []
    assert check_frames({str(path): [(2, 10)]}, 'decode', 'hdf5') != []


def test_count_short_videos():
    recs = [VideoRecord(str(n), 'x', 0, n, 0, (1, n + 1)) for n in (7, 8, 15, 16, 30)]
    assert count_short_videos(recs, 8) == 1           # span 8
    assert count_short_videos(recs, 8, t_stride=2) == 2  # span 15: 7 and 8
    assert count_short_videos(recs, 16, t_stride=2) == 5  # span 31
