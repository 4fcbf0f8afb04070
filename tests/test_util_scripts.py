"""Tests of the data-preparation and evaluation scripts in util_scripts/.

Everything runs in tmp_path on tiny data; the videos are written with PyAV
(no ffmpeg binary is needed anywhere).
"""
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from datasets.video_accuracy import evaluate_file
from tests.video_files import frame_image, frame_level, write_video
from util_scripts import (
    eval_accuracy,
    generate_video_hdf5,
    generate_video_jpgs,
    hmdb51_json,
    kinetics_json,
    mit_json,
    ucf101_json,
)

REPO = Path(__file__).resolve().parents[1]


def jpeg_bytes(seed):
    """A small real JPEG whose bytes differ per seed."""
    buf = io.BytesIO()
    Image.new('RGB', (8, 6), (seed * 37 % 256, seed * 11 % 256, 90)).save(
        buf, format='JPEG')
    return buf.getvalue()


def make_frames(folder, n):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, n + 1):
        (folder / f'image_{i:05d}.jpg').write_bytes(jpeg_bytes(i))
    return folder


def make_hdf5(path, n):
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, 'w') as f:
        data = np.empty(n, dtype=object)
        for i in range(n):
            data[i] = np.frombuffer(jpeg_bytes(i), dtype=np.uint8)
        f.create_dataset('video', data=data, dtype=h5py.vlen_dtype(np.uint8))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def entry(subset, segment, label=None):
    annotations = {'segment': segment}
    if label is not None:
        annotations['label'] = label
    return {'subset': subset, 'annotations': annotations}


# ------------------------------------------------------------ ucf101_json

def test_ucf101_json(tmp_path, capsys):
    splits = tmp_path / 'ucfTrainTestlist'
    splits.mkdir()
    # Official files use CRLF; classInd order is by index, not by line.
    (splits / 'classInd.txt').write_bytes(b'2 Bravo\r\n1 Alpha\r\n3 Charlie\r\n')
    (splits / 'trainlist01.txt').write_bytes(
        b'Alpha/v_Alpha_g01_c01.avi 1\r\nBravo/v_Bravo_g01_c01.avi 2\r\n'
        b'Bravo/v_Bravo_g09_c01.avi 2\r\n')
    (splits / 'testlist01.txt').write_bytes(b'Alpha/v_Alpha_g02_c01.avi\r\n')
    videos = tmp_path / 'jpg'
    make_frames(videos / 'Alpha' / 'v_Alpha_g01_c01', 3)
    make_frames(videos / 'Alpha' / 'v_Alpha_g02_c01', 2)
    make_hdf5(videos / 'Bravo' / 'v_Bravo_g01_c01.hdf5', 4)

    ucf101_json.main([str(splits), str(videos), str(tmp_path / 'out')])

    assert sorted(os.listdir(tmp_path / 'out')) == ['ucf101_01.json']
    assert read_json(tmp_path / 'out' / 'ucf101_01.json') == {
        'labels': ['Alpha', 'Bravo', 'Charlie'],
        'database': {
            'v_Alpha_g01_c01': entry('training', [1, 4], 'Alpha'),
            'v_Bravo_g01_c01': entry('training', [0, 4], 'Bravo'),
            'v_Alpha_g02_c01': entry('validation', [1, 3], 'Alpha'),
        }}
    assert 'Bravo/v_Bravo_g09_c01' in capsys.readouterr().err
    first = (tmp_path / 'out' / 'ucf101_01.json').read_text()

    ucf101_json.main([str(splits), str(videos), str(tmp_path / 'out')])  # the same: nothing kept
    assert sorted(os.listdir(tmp_path / 'out')) == ['ucf101_01.json']
    assert 'note:' not in capsys.readouterr().out
    shutil.rmtree(videos / 'Alpha' / 'v_Alpha_g02_c01')  # another build: the first one is kept beside it
    ucf101_json.main([str(splits), str(videos), str(tmp_path / 'out')])
    assert sorted(os.listdir(tmp_path / 'out')) == ['ucf101_01.json', 'ucf101_01.previous.json']
    assert (tmp_path / 'out' / 'ucf101_01.previous.json').read_text() == first
    assert f'note: {tmp_path}/out/ucf101_01.json held another annotation' in capsys.readouterr().out


def test_ucf101_json_missing_inputs(tmp_path):
    with pytest.raises(SystemExit, match='classInd.txt'):
        ucf101_json.main([str(tmp_path), str(tmp_path), str(tmp_path / 'o')])
    (tmp_path / 'classInd.txt').write_text('1 A\n')
    (tmp_path / 'trainlist01.txt').write_text('A/v_A_g01_c01.avi 1\n')
    with pytest.raises(SystemExit, match='testlist01.txt'):
        ucf101_json.main([str(tmp_path), str(tmp_path), str(tmp_path / 'o')])
    (tmp_path / 'testlist01.txt').write_text('A/v_A_g02_c01.avi\n')
    # Nothing on disk: almost surely a wrong video_path, so it is an error.
    with pytest.raises(SystemExit, match='Check video_path'):
        ucf101_json.main([str(tmp_path), str(tmp_path), str(tmp_path / 'o')])


def test_gap_in_frames_truncates_segment(tmp_path, capsys):
    (tmp_path / 'classInd.txt').write_text('1 A\n')
    (tmp_path / 'trainlist01.txt').write_text('A/v_A_g01_c01.avi 1\n')
    (tmp_path / 'testlist01.txt').write_text('A/v_A_g02_c01.avi\n')
    folder = make_frames(tmp_path / 'jpg' / 'A' / 'v_A_g01_c01', 5)
    (folder / 'image_00004.jpg').unlink()
    make_frames(tmp_path / 'jpg' / 'A' / 'v_A_g02_c01', 0)  # empty folder
    ucf101_json.main([str(tmp_path), str(tmp_path / 'jpg'), str(tmp_path)])
    database = read_json(tmp_path / 'ucf101_01.json')['database']
    # Frames 1-3 are contiguous: the loader must never ask for frame 4.
    assert database == {'v_A_g01_c01': entry('training', [1, 4], 'A')}
    err = capsys.readouterr().err
    assert 'missing frame' in err and 'without frames' in err


def test_ucf101_json_on_video_files(tmp_path, capsys):
    """The builder on the .avi folder itself (--file_type video): 0-based
    segments, AVI counts by decoding, MP4 from the header, broken files listed."""
    (tmp_path / 'classInd.txt').write_text('1 A\n2 B\n')
    (tmp_path / 'trainlist01.txt').write_text(
        'A/v_A_g01_c01.avi 1\nB/v_B_g01_c01.avi 2\nB/v_B_g02_c01.avi 2\n'
        'B/v_B_g03_c01.avi 2\n')
    (tmp_path / 'testlist01.txt').write_text('A/v_A_g02_c01.avi\n')
    videos = tmp_path / 'videos'
    write_video(videos / 'A' / 'v_A_g01_c01.avi', n_frames=9)
    write_video(videos / 'A' / 'v_A_g02_c01.avi', n_frames=4)
    write_video(videos / 'B' / 'v_B_g01_c01.mp4', n_frames=6)
    (videos / 'B' / 'v_B_g02_c01.avi').write_bytes(b'broken')
    ucf101_json.main([str(tmp_path), str(videos), str(tmp_path)])
    assert read_json(tmp_path / 'ucf101_01.json')['database'] == {
        'v_A_g01_c01': entry('training', [0, 9], 'A'),
        'v_B_g01_c01': entry('training', [0, 6], 'B'),
        'v_A_g02_c01': entry('validation', [0, 4], 'A')}
    out = capsys.readouterr()
    assert '1 from the container header' in out.out
    assert '2 by decoding every frame' in out.out
    assert 'cannot be decoded, skipped: B/v_B_g02_c01' in out.err
    assert 'not found, skipped: B/v_B_g03_c01' in out.err


# ------------------------------------------------------------ hmdb51_json

def test_hmdb51_json(tmp_path):
    splits = tmp_path / 'splits'
    splits.mkdir()
    (splits / 'brush_hair_test_split1.txt').write_text(
        'Brushing.Her.Hair_brush_hair_f_nm_np1_ba_goo_0.avi 1 \n'
        'b1.avi 2 \nb2.avi 0 \n')
    (splits / 'brush_hair_test_split2.txt').write_text(
        'Brushing.Her.Hair_brush_hair_f_nm_np1_ba_goo_0.avi 2 \n'
        'b1.avi 0 \nb2.avi 1 \n')
    (splits / 'fall_floor_test_split1.txt').write_text('f1.avi 1 \n')
    (splits / 'README.txt').write_text('not a split file\n')
    videos = tmp_path / 'jpg'
    make_frames(videos / 'brush_hair' /
                'Brushing.Her.Hair_brush_hair_f_nm_np1_ba_goo_0', 3)
    make_frames(videos / 'brush_hair' / 'b1', 2)
    make_frames(videos / 'brush_hair' / 'b2', 5)
    make_hdf5(videos / 'fall_floor' / 'f1.hdf5', 6)

    hmdb51_json.main([str(splits), str(videos), str(tmp_path / 'out')])

    labels = ['brush_hair', 'fall_floor']
    assert sorted(os.listdir(tmp_path / 'out')) == ['hmdb51_1.json',
                                                    'hmdb51_2.json']
    long_id = 'Brushing.Her.Hair_brush_hair_f_nm_np1_ba_goo_0'
    assert read_json(tmp_path / 'out' / 'hmdb51_1.json') == {
        'labels': labels,
        'database': {
            long_id: entry('training', [1, 4], 'brush_hair'),
            'b1': entry('validation', [1, 3], 'brush_hair'),
            'f1': entry('training', [0, 6], 'fall_floor'),
        }}
    assert read_json(tmp_path / 'out' / 'hmdb51_2.json') == {
        'labels': labels,
        'database': {
            long_id: entry('validation', [1, 4], 'brush_hair'),
            'b2': entry('training', [1, 6], 'brush_hair'),
        }}


def test_hmdb51_json_bad_line(tmp_path):
    (tmp_path / 'a_test_split1.txt').write_text('x.avi 7\n')
    with pytest.raises(SystemExit, match=r'a_test_split1.txt.*x\.avi 7'):
        hmdb51_json.main([str(tmp_path), str(tmp_path), str(tmp_path)])
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(SystemExit, match='no <class>_test_split'):
        hmdb51_json.main([str(empty), str(tmp_path), str(tmp_path)])


# ------------------------------------------------------------ kinetics_json

def write_kinetics_csvs(folder, prefix=''):
    folder.mkdir(parents=True, exist_ok=True)
    header = 'label,youtube_id,time_start,time_end,split,is_cc\n'
    train = folder / f'{prefix}train.csv'
    train.write_text(header +
                     'zumba,zz1,5,15,train,0\n'
                     'abseiling,ab1,0,10,train,0\n'
                     'air drumming,ad1,12,22,train,1\n'
                     'abseiling,gone,1,11,train,0\n')
    val = folder / f'{prefix}val.csv'
    val.write_text(header + 'zumba,zz2,100,110,val,0\n')
    test = folder / f'{prefix}test.csv'
    test.write_text('youtube_id,time_start,time_end,split\n'
                    'tt1,3,13,test\n')
    return train, val, test


KINETICS_LABELS = ['abseiling', 'air drumming', 'zumba']


def test_kinetics_json_jpg(tmp_path, capsys):
    train, val, test = write_kinetics_csvs(tmp_path / 'csv')
    videos = tmp_path / 'jpg'
    make_frames(videos / 'zumba' / 'zz1_000005_000015', 3)
    make_frames(videos / 'abseiling' / 'ab1_000000_000010', 2)
    make_frames(videos / 'air drumming' / 'ad1_000012_000022', 4)
    make_frames(videos / 'zumba' / 'zz2_000100_000110', 1)
    make_frames(videos / 'test' / 'tt1_000003_000013', 2)
    dst = tmp_path / 'kinetics.json'

    kinetics_json.main([str(train), str(val), str(test), str(videos), 'jpg',
                        str(dst)])

    assert read_json(dst) == {
        'labels': KINETICS_LABELS,
        'database': {
            'zz1_000005_000015': entry('training', [1, 4], 'zumba'),
            'ab1_000000_000010': entry('training', [1, 3], 'abseiling'),
            'ad1_000012_000022': entry('training', [1, 5], 'air drumming'),
            'zz2_000100_000110': entry('validation', [1, 2], 'zumba'),
            # No label: the loader gives target -1 but needs the segment.
            'tt1_000003_000013': entry('testing', [1, 3]),
        }}
    out = capsys.readouterr()
    assert '5 of 6 listed videos found on disk (1 skipped)' in out.out
    assert 'abseiling/gone_000001_000011' in out.err


def test_kinetics_json_hdf5_and_predecessor_form(tmp_path):
    # The predecessor's form: csv_dir n_classes video_path video_type dst.
    write_kinetics_csvs(tmp_path / 'csv', prefix='kinetics-3_')
    (tmp_path / 'csv' / 'kinetics-3_test.csv').unlink()  # test is optional
    videos = tmp_path / 'h5'
    make_hdf5(videos / 'zumba' / 'zz1_000005_000015.hdf5', 3)
    make_hdf5(videos / 'abseiling' / 'ab1_000000_000010.hdf5', 2)
    make_hdf5(videos / 'zumba' / 'zz2_000100_000110.hdf5', 7)
    # A jpg folder must not count when hdf5 was asked for.
    make_frames(videos / 'air drumming' / 'ad1_000012_000022', 4)
    dst = tmp_path / 'kinetics.json'

    kinetics_json.main([str(tmp_path / 'csv'), '3', str(videos), 'hdf5',
                        str(dst)])

    assert read_json(dst) == {
        'labels': KINETICS_LABELS,
        'database': {
            'zz1_000005_000015': entry('training', [0, 3], 'zumba'),
            'ab1_000000_000010': entry('training', [0, 2], 'abseiling'),
            'zz2_000100_000110': entry('validation', [0, 7], 'zumba'),
        }}


def test_kinetics_json_video(tmp_path):
    train, val, test = write_kinetics_csvs(tmp_path / 'csv')
    videos = tmp_path / 'videos'
    write_video(videos / 'zumba' / 'zz1_000005_000015.mp4', n_frames=5)
    write_video(videos / 'zumba' / 'zz2_000100_000110.webm', n_frames=3)
    make_frames(videos / 'abseiling' / 'ab1_000000_000010', 4)  # not a video file
    dst = tmp_path / 'kinetics.json'
    kinetics_json.main([str(train), str(val), str(test), str(videos), 'video', str(dst)])
    assert read_json(dst)['database'] == {
        'zz1_000005_000015': entry('training', [0, 5], 'zumba'),
        'zz2_000100_000110': entry('validation', [0, 3], 'zumba')}


def test_kinetics_json_errors(tmp_path):
    train, val, test = write_kinetics_csvs(tmp_path / 'csv')
    with pytest.raises(SystemExit):  # argparse: wrong video type
        kinetics_json.main([str(train), str(val), str(test), str(tmp_path),
                            'mp4', str(tmp_path / 'k.json')])
    with pytest.raises(SystemExit, match='validation CSV not found'):
        kinetics_json.main([str(train), str(tmp_path / 'nope.csv'),
                            str(test), str(tmp_path), 'jpg',
                            str(tmp_path / 'k.json')])
    val.write_text('label,youtube_id,time_start,time_end\nzumba,x,,2\n')
    with pytest.raises(SystemExit, match='line 2: bad time_start'):
        kinetics_json.main([str(train), str(val), str(test), str(tmp_path),
                            'jpg', str(tmp_path / 'k.json')])
    val.write_text('youtube_id,time_start,time_end\nx,1,2\n')
    with pytest.raises(SystemExit, match='missing column.*label'):
        kinetics_json.main([str(train), str(val), str(test), str(tmp_path),
                            'jpg', str(tmp_path / 'k.json')])


# ------------------------------------------------------------ mit_json

def test_mit_json(tmp_path):
    ann = tmp_path / 'Moments_in_Time'
    ann.mkdir()
    (ann / 'moments_categories.txt').write_text('running,1\nadult+female+'
                                                'singing,0\n')
    (ann / 'trainingSet.csv').write_text(
        'running/yt-abc_12.mp4,running,3,0\n'
        'adult+female+singing/flickr-1.mp4,adult+female+singing,4,1\n')
    (ann / 'validationSet.csv').write_text('running/getty-9.mp4,running,2,1\n')
    (ann / 'testingSet.csv').write_text('unknown-7.mp4\n')
    videos = tmp_path / 'jpg'
    make_frames(videos / 'running' / 'yt-abc_12', 3)
    make_frames(videos / 'adult+female+singing' / 'flickr-1', 2)
    make_hdf5(videos / 'running' / 'getty-9.hdf5', 5)
    make_frames(videos / 'test' / 'unknown-7', 4)
    dst = tmp_path / 'out' / 'mit.json'

    mit_json.main([str(ann), str(videos), str(dst)])

    assert read_json(dst) == {
        'labels': ['adult+female+singing', 'running'],
        'database': {
            'yt-abc_12': entry('training', [1, 4], 'running'),
            'flickr-1': entry('training', [1, 3], 'adult+female+singing'),
            'getty-9': entry('validation', [0, 5], 'running'),
            'unknown-7': entry('testing', [1, 5]),
        }}

    (ann / 'validationSet.csv').unlink()
    with pytest.raises(SystemExit, match='validationSet.csv not found'):
        mit_json.main([str(ann), str(videos), str(dst)])


# ------------------------------------------------------------ generate_video_hdf5

def test_generate_video_hdf5_from_jpgs(tmp_path, capsys):
    jpg = tmp_path / 'jpg'
    make_frames(jpg / 'Alpha' / 'v1', 3)
    make_frames(jpg / 'Bravo' / 'v2', 12)  # image_00010+ sorts after 00009
    (jpg / 'Bravo' / '.v3.tmp').mkdir()  # unfinished extraction: ignored
    dst = tmp_path / 'h5'

    generate_video_hdf5.main([str(jpg), str(dst), 'ucf101', '--n_jobs', '1'])

    for cls, vid, n in (('Alpha', 'v1', 3), ('Bravo', 'v2', 12)):
        with h5py.File(dst / cls / f'{vid}.hdf5', 'r') as f:
            assert list(f.keys()) == ['video']
            video = f['video']
            assert video.shape == (n,)
            assert video.dtype == h5py.vlen_dtype(np.uint8)
            for i in range(n):
                assert video[i].tobytes() == (
                    jpg / cls / vid / f'image_{i + 1:05d}.jpg').read_bytes()
    assert sorted(p.name for p in dst.rglob('*')) == [
        'Alpha', 'Bravo', 'v1.hdf5', 'v2.hdf5']  # no temp file left
    assert '2 converted, 0 already done, 0 failed' in capsys.readouterr().out

    mtime = (dst / 'Alpha' / 'v1.hdf5').stat().st_mtime_ns
    generate_video_hdf5.main([str(jpg), str(dst), 'ucf101', '--n_jobs', '1'])
    assert '0 converted, 2 already done' in capsys.readouterr().out
    assert (dst / 'Alpha' / 'v1.hdf5').stat().st_mtime_ns == mtime


def test_generate_video_hdf5_parallel_flat_and_gap(tmp_path, capsys):
    jpg = tmp_path / 'jpg'
    make_frames(jpg / 'a', 2)
    make_frames(jpg / 'b', 3)
    (make_frames(jpg / 'c', 4) / 'image_00002.jpg').unlink()
    dst = tmp_path / 'h5'
    # A video with a missing frame is refused (element i must stay frame
    # i + 1); the others are converted and the exit status says it failed.
    with pytest.raises(SystemExit, match='1 video'):
        generate_video_hdf5.main([str(jpg), str(dst), 'activitynet',
                                  '--n_jobs', '2'])
    assert 'image_00002.jpg is missing' in capsys.readouterr().err
    assert sorted(p.name for p in dst.iterdir()) == ['a.hdf5', 'b.hdf5']
    with h5py.File(dst / 'b.hdf5', 'r') as f:
        assert f['video'][2].tobytes() == (jpg / 'b' /
                                           'image_00003.jpg').read_bytes()


def test_generate_video_hdf5_missing_input(tmp_path):
    with pytest.raises(SystemExit, match='dir_path is not a directory'):
        generate_video_hdf5.main([str(tmp_path / 'nope'), str(tmp_path),
                                  'kinetics'])
    with pytest.raises(SystemExit, match='no frame folder .* nor video file'):
        generate_video_hdf5.main([str(tmp_path), str(tmp_path / 'o'),
                                  'kinetics'])


# ------------------------------------------------------------ generate_video_jpgs

def jpg_folder(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def video_tree(tmp_path):
    """UCF-like tree: 2 classes, an .avi, an .mp4 (B-frames), an .mkv, a file
    that is not a video despite its name, a text file and a macOS fork."""
    videos = tmp_path / 'videos'
    write_video(videos / 'Alpha' / 'v1.avi', n_frames=12)
    write_video(videos / 'Alpha' / 'v2.mp4', n_frames=7)
    write_video(videos / 'Bravo' / 'v3.mkv', n_frames=5)
    (videos / 'Bravo' / 'broken.mp4').write_bytes(b'not a video')
    (videos / 'Bravo' / 'notes.txt').write_text('x')
    (videos / 'Bravo' / '._v4.mp4').write_bytes(b'x')
    return videos


def test_generate_video_jpgs(tmp_path, video_tree, capsys, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))  # no ffmpeg binary reachable
    dst = tmp_path / 'jpg'
    argv = [str(video_tree), str(dst), 'ucf101', '--n_jobs', '1', '--size', '48']
    with pytest.raises(SystemExit, match='1 video'):
        generate_video_jpgs.main(argv)
    out = capsys.readouterr()
    # the summary names the broken file and why; the others were converted
    assert 'broken.mp4: video file' in out.err and 'cannot be opened' in out.err
    assert 'notes.txt' in out.err
    assert '3 converted, 0 already done, 1 failed' in out.out
    for rel, n in (('Alpha/v1', 12), ('Alpha/v2', 7), ('Bravo/v3', 5)):
        names = jpg_folder(dst / rel)
        assert names == [f'image_{i:05d}.jpg' for i in range(1, n + 1)]
        # every frame once, in order; 32x24 with short side 48 -> 64x48
        images = [Image.open(dst / rel / name) for name in names]
        assert [frame_level(im) for im in images] == list(range(n))
        assert images[0].size == (64, 48)
    assert jpg_folder(dst / 'Bravo') == ['v3']  # nothing left of the failure

    # restart: complete folders skipped, an interrupted one (its hidden
    # temporary folder) and a folder with a gap redone
    shutil.rmtree(dst / 'Alpha' / 'v1')
    make_frames(dst / 'Alpha' / '.v1.tmp', 2)
    (dst / 'Alpha' / 'v2' / 'image_00003.jpg').unlink()
    mtime = (dst / 'Bravo' / 'v3' / 'image_00001.jpg').stat().st_mtime_ns
    with pytest.raises(SystemExit):
        generate_video_jpgs.main(argv)
    assert '2 converted, 1 already done, 1 failed' in capsys.readouterr().out
    assert jpg_folder(dst / 'Alpha') == ['v1', 'v2']
    assert len(jpg_folder(dst / 'Alpha' / 'v1')) == 12
    assert len(jpg_folder(dst / 'Alpha' / 'v2')) == 7
    assert (dst / 'Bravo' / 'v3' / 'image_00001.jpg').stat().st_mtime_ns == mtime


def test_generate_video_jpgs_sizes_fps_rotation(tmp_path):
    videos = tmp_path / 'videos'
    # 176x144 is smaller than --size 240: enlarged, aspect ratio kept
    write_video(videos / 'small.mp4', n_frames=2, width=176, height=144)
    write_video(videos / 'fast.avi', n_frames=12, fps=25)
    img = frame_image(0, 32, 24)
    img[:4, :6] = (0, 255, 0)
    write_video(videos / 'phone.mp4', images=[img] * 2, rotation=-90)
    generate_video_jpgs.main([str(videos), str(tmp_path / 'jpg'),
                              'activitynet', '--n_jobs', '2'])
    assert Image.open(tmp_path / 'jpg' / 'small' / 'image_00001.jpg').size == (293, 240)
    # rotated: stored 32x24, shown upright as 24x32 -> short side 240
    phone = Image.open(tmp_path / 'jpg' / 'phone' / 'image_00001.jpg')
    assert phone.size == (240, 320)
    green = np.asarray(phone)[..., 1] > 200
    assert green[:40, -60:].mean() > 0.5 and green[-40:, :60].mean() < 0.1
    generate_video_jpgs.main([str(videos), str(tmp_path / 'half'), 'activitynet',
                              '--n_jobs', '1', '--fps', '12.5', '--size', '-1'])
    frames = jpg_folder(tmp_path / 'half' / 'fast')
    assert len(frames) == 6  # 12 frames at 25 fps = 0.48 s at 12.5 fps
    assert [frame_level(Image.open(tmp_path / 'half' / 'fast' / f)) for f in frames] == \
        [0, 2, 4, 6, 8, 10]
    assert Image.open(tmp_path / 'half' / 'fast' / frames[0]).size == (32, 24)


def test_generate_video_jpgs_no_videos(tmp_path):
    with pytest.raises(SystemExit, match='no video file found'):
        generate_video_jpgs.main([str(tmp_path), str(tmp_path / 'o'), 'kinetics'])


def test_generate_video_hdf5_from_video(tmp_path, video_tree, capsys):
    h5 = tmp_path / 'h5'
    argv = [str(video_tree), str(h5), 'ucf101', '--from_video', '--n_jobs', '2',
            '--size', '12']
    with pytest.raises(SystemExit, match='1 video'):
        generate_video_hdf5.main(argv)
    assert 'broken.mp4' in capsys.readouterr().err
    # one pass, same bytes as the jpg tool writes
    generate_video_jpgs.main([str(video_tree / 'Alpha'), str(tmp_path / 'jpg'),
                              'activitynet', '--size', '12'])
    with h5py.File(h5 / 'Alpha' / 'v1.hdf5', 'r') as f:
        assert f['video'].shape == (12,)
        for i in range(12):
            assert f['video'][i].tobytes() == (
                tmp_path / 'jpg' / 'v1' / f'image_{i + 1:05d}.jpg').read_bytes()
    assert sorted(p.name for p in h5.rglob('*')) == [
        'Alpha', 'Bravo', 'v1.hdf5', 'v2.hdf5', 'v3.hdf5']  # no temp file left
    with pytest.raises(SystemExit):
        generate_video_hdf5.main(argv)
    assert '0 converted, 3 already done, 1 failed' in capsys.readouterr().out


def test_generate_video_hdf5_predecessor_command_decodes_videos(tmp_path, video_tree, capsys):
    """The predecessor's `generate_video_hdf5 videos/ hdf5/ ucf101` decodes the
    videos it is given: without --from_video too, the same files result."""
    (video_tree / 'Bravo' / 'broken.mp4').unlink()
    generate_video_hdf5.main([str(video_tree), str(tmp_path / 'auto'), 'ucf101'])
    out = capsys.readouterr().out
    assert 'holds video files' in out and '3 converted' in out
    generate_video_hdf5.main([str(video_tree), str(tmp_path / 'flag'), 'ucf101',
                              '--from_video'])
    for rel in ('Alpha/v1', 'Alpha/v2', 'Bravo/v3'):
        with h5py.File(tmp_path / 'auto' / f'{rel}.hdf5', 'r') as a, \
                h5py.File(tmp_path / 'flag' / f'{rel}.hdf5', 'r') as b:
            assert len(a['video']) == len(b['video']) > 0
            assert all(np.array_equal(x, y) for x, y in zip(a['video'], b['video']))
    # ActivityNet's flat folder of videos, and frame folders still packed
    generate_video_hdf5.main([str(video_tree / 'Alpha'), str(tmp_path / 'flat'),
                              'activitynet', '--n_jobs', '1'])
    assert sorted(p.name for p in (tmp_path / 'flat').iterdir()) == ['v1.hdf5', 'v2.hdf5']
    make_frames(tmp_path / 'jpg' / 'Alpha' / 'v1', 3)
    capsys.readouterr()
    generate_video_hdf5.main([str(tmp_path / 'jpg'), str(tmp_path / 'packed'), 'ucf101'])
    assert 'holds video files' not in capsys.readouterr().out
    with h5py.File(tmp_path / 'packed' / 'Alpha' / 'v1.hdf5', 'r') as f:
        assert len(f['video']) == 3


@pytest.mark.parametrize('dataset, layout', [
    ('ucf101', 'ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi'),
    ('hmdb51', 'brush_hair/April_09_brush_hair_u_nm_np1_ba_goo_0.avi'),
    ('kinetics', 'abseiling/0347ZoDXyP0_000095_000105.mp4'),
    ('mit', 'adult+female+singing/yt-0hr6eQz4G4Q_15.mp4'),
    ('activitynet', 'v_---9CpRcKoU.mp4')])
def test_generate_video_jpgs_predecessor_command_lines(tmp_path, dataset, layout):
    """`python -m util_scripts.generate_video_jpgs <videos> <jpgs> <dataset>` as
    the predecessor's README gives it, with its --n_jobs/--fps/--size spellings."""
    write_video(tmp_path / 'videos' / layout, n_frames=4)
    generate_video_jpgs.main([str(tmp_path / 'videos'), str(tmp_path / 'jpg'), dataset,
                              '--n_jobs', '1', '--fps', '-1', '--size', '240'])
    folder = tmp_path / 'jpg' / layout.rsplit('.', 1)[0]
    assert jpg_folder(folder) == [f'image_{i:05d}.jpg' for i in range(1, 5)]


# ------------------------------------------------------------ eval_accuracy

@pytest.fixture
def gt_and_result(tmp_path):
    gt = {'labels': ['a', 'b', 'c'],
          'database': {
              'v1': entry('validation', [1, 5], 'a'),
              'v2': entry('validation', [1, 5], 'b'),
              'v3': entry('validation', [1, 5], 'c'),
              'v4': entry('validation', [1, 5], 'a'),
              't1': entry('training', [1, 5], 'a'),
              'x1': entry('testing', [1, 5])}}
    results = {'results': {
        # Not sorted by score: the tool must sort.
        'v1': [{'label': 'b', 'score': 0.2}, {'label': 'a', 'score': 0.7},
               {'label': 'c', 'score': 0.1}],
        'v2': [{'label': 'a', 'score': 0.5}, {'label': 'b', 'score': 0.4},
               {'label': 'c', 'score': 0.1}],
        'v3': [{'label': 'c', 'score': 0.9}, {'label': 'a', 'score': 0.1}],
        # v4 has no result; t1 (training) is not evaluated.
        't1': [{'label': 'c', 'score': 1.0}]}}
    gt_path = tmp_path / 'gt.json'
    gt_path.write_text(json.dumps(gt))
    result_path = tmp_path / 'results' / 'val.json'
    result_path.parent.mkdir()
    result_path.write_text(json.dumps(results))
    return gt_path, result_path


def compute_accuracy(gt, res, k=1, subset='validation', ignore=False):
    """(top-k accuracy, hits, videos) of evaluate_file, the one evaluation path."""
    e = evaluate_file(gt, res, subset, ignore, ks=(k,))
    return e.topk(k), e.topk_hits[k], e.n_videos


def test_eval_accuracy_top1_top2_ignore(gt_and_result):
    gt, res = gt_and_result
    # top-1: v1 right, v2 wrong, v3 right, v4 missing (wrong) -> 2/4.
    assert compute_accuracy(gt, res) == (0.5, 2, 4)
    # top-2: v2's second label is right -> 3/4.
    assert compute_accuracy(gt, res, k=2) == (0.75, 3, 4)
    # --ignore: only v1..v3 count.
    assert compute_accuracy(gt, res, ignore=True) == (
        pytest.approx(2 / 3), 2, 3)
    assert compute_accuracy(gt, res, subset='train') == (
        0.0, 0, 1)


@pytest.mark.slow
def test_eval_accuracy_cli(gt_and_result, capsys):
    gt, res = gt_and_result
    assert eval_accuracy.main([str(gt), str(res), '--subset', 'val',
                               '--save']) == 0.5
    assert 'top-1 accuracy: 0.5000 (2/4)' in capsys.readouterr().out
    assert (res.parent / 'top1.txt').read_text() == '0.5'
    eval_accuracy.main([str(gt), str(res), '-k', '2', '--ignore'])
    assert 'top-2 accuracy: 1.0000 (3/3)' in capsys.readouterr().out
    # Runs as a module from the repository root too.
    proc = subprocess.run([sys.executable, '-m', 'util_scripts.eval_accuracy',
                           str(gt), str(res), '-k', '2'], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0
    assert 'top-2 accuracy: 0.7500 (3/4)' in proc.stdout


def test_eval_accuracy_says_how_many_videos_have_no_result(gt_and_result, capsys):
    """A result file covering some of the subset (predict.py --json on part of
    it): the accuracy counts the others as wrong, and says so, printed and
    in top<k>.json beside top<k>.txt."""
    gt, res = gt_and_result
    assert eval_accuracy.main([str(gt), str(res), '--save']) == 0.5
    note = ("note: 1 of the 4 'validation' videos have no result: counted as wrong (--ignore "
            "evaluates the 3 with a result only)")
    assert note in capsys.readouterr().out.splitlines()
    assert (res.parent / 'top1.txt').read_text() == '0.5'  # the predecessor's content
    assert json.loads((res.parent / 'top1.json').read_text()) == {
        'k': 1, 'accuracy': 0.5, 'hits': 2, 'videos': 4, 'videos_without_result': 1,
        'without_result_counted': 'as wrong', 'note': note}
    eval_accuracy.main([str(gt), str(res), '--save', '--ignore'])
    assert ("note: 1 of the 4 'validation' videos have no result: left out (--ignore); the "
            "accuracy is over the 3 with one") in capsys.readouterr().out
    assert json.loads((res.parent / 'top1.json').read_text())['without_result_counted'] == \
        'left out (--ignore)'
    results = json.loads(res.read_text())
    results['results']['v4'] = [{'label': 'a', 'score': 1.0}]
    res.write_text(json.dumps(results))
    eval_accuracy.main([str(gt), str(res), '--save'])
    assert 'note' not in capsys.readouterr().out
    assert json.loads((res.parent / 'top1.json').read_text())['videos_without_result'] == 0


def test_eval_accuracy_reads_and_counts_once(gt_and_result, monkeypatch, capsys):
    """One evaluation path: the printed figure and top<k>.txt are the same count."""
    import datasets.video_accuracy
    gt, res = gt_and_result
    reads = []
    real = datasets.video_accuracy.load_results
    monkeypatch.setattr(datasets.video_accuracy, 'load_results',
                        lambda path: reads.append(path) or real(path))
    eval_accuracy.main([str(gt), str(res), '-k', '2', '--save'])
    assert len(reads) == 1
    # 3 classes: top-5 is printed as skipped, and then not saved either
    with pytest.raises(SystemExit, match='top-5 accuracy: skipped'):
        eval_accuracy.main([str(gt), str(res), '-k', '5', '--save'])
    assert 'top-5 accuracy: skipped (only 3 classes)' in capsys.readouterr().out
    assert not (res.parent / 'top5.txt').exists()


def test_eval_accuracy_top_k_up_to_the_labels_the_file_holds(tmp_path, capsys):
    """A result file of 3 labels per video (--output_topk 3) over 10 classes: its
    "top-5" would be top-3; it is printed as top-3, and top-5 as not there."""
    labels = [f'c{i}' for i in range(10)]
    database = {f'v{i}': entry('validation', [1, 5], labels[i]) for i in range(4)}
    gt = tmp_path / 'gt.json'
    gt.write_text(json.dumps({'labels': labels, 'database': database}))
    ranked = {'v0': ['c0', 'c1', 'c2'],   # top-1
              'v1': ['c0', 'c1', 'c2'],   # 2nd
              'v2': ['c0', 'c1', 'c5'],   # not among the 3: 4th or 5th, or later
              'v3': ['c7', 'c8', 'c9']}
    res = tmp_path / 'val.json'
    res.write_text(json.dumps({'results': {v: [{'label': name, 'score': 0.5 - 0.1 * i}
                                              for i, name in enumerate(names)]
                                          for v, names in ranked.items()}}))
    eval_accuracy.main([str(gt), str(res)])
    out = capsys.readouterr().out
    assert 'top-1 accuracy: 0.2500 (1/4)' in out
    assert 'top-3 accuracy: 0.5000 (2/4)' in out
    assert 'top-5 accuracy: not in the results, which rank 3 labels per video' in out
    assert '--output_topk 5' in out
    with pytest.raises(SystemExit, match='rank 3 labels per video'):
        eval_accuracy.main([str(gt), str(res), '-k', '5', '--save'])
    assert eval_accuracy.main([str(gt), str(res), '-k', '3']) == 0.5
    # per-clip results: the labels each clip ranks
    clips = {v: [{'segment': [1, 5], 'result': [{'label': name, 'score': 0.3}
                                                 for name in names]}] * 2
             for v, names in ranked.items()}
    res.write_text(json.dumps({'results': clips}))
    eval_accuracy.main([str(gt), str(res)])
    assert 'top-5 accuracy: not in the results, which rank 3' in capsys.readouterr().out


def test_eval_accuracy_empty_subset(gt_and_result):
    gt, res = gt_and_result
    with pytest.raises(ValueError) as info:
        compute_accuracy(gt, res, subset='testing')
    message = str(info.value)
    assert "subset 'testing'" in message
    assert 'training (1 labelled)' in message
    assert 'validation (4 labelled)' in message
    with pytest.raises(SystemExit, match="subset 'valid'"):
        eval_accuracy.main([str(gt), str(res), '--subset', 'valid'])
    with pytest.raises(SystemExit, match='result JSON not found'):
        eval_accuracy.main([str(gt), str(res) + '.nope'])


def test_eval_accuracy_no_overlap(tmp_path, gt_and_result, capsys):
    gt, _ = gt_and_result
    other = tmp_path / 'other.json'
    other.write_text(json.dumps({'results': {'zz': [{'label': 'a',
                                                     'score': 1.0}]}}))
    assert compute_accuracy(gt, other) == (0.0, 0, 4)
    assert 'check --subset' in capsys.readouterr().err
    with pytest.raises(ValueError, match='check --subset'):
        compute_accuracy(gt, other, ignore=True)


def test_eval_accuracy_per_clip(tmp_path, gt_and_result):
    gt, _ = gt_and_result
    clip_results = {'results': {
        # a: (0.6 + 0.1) / 2 = 0.35, b: (0.4 + 0.9) / 2 = 0.65 -> b (wrong).
        'v1': [{'segment': [1, 17], 'result': [{'label': 'a', 'score': 0.6},
                                                {'label': 'b', 'score': 0.4}]},
               {'segment': [17, 33], 'result': [{'label': 'b', 'score': 0.9},
                                                 {'label': 'a', 'score': 0.1}]}],
        # b: 0.5 / 2 = 0.25 (absent from clip 2), c: (0.3 + 0.35) / 2 -> c.
        'v3': [{'segment': [1, 17], 'result': [{'label': 'b', 'score': 0.5},
                                                {'label': 'c', 'score': 0.3}]},
               {'segment': [17, 33], 'result': [{'label': 'c',
                                                  'score': 0.35}]}]}}
    path = tmp_path / 'clips.json'
    path.write_text(json.dumps(clip_results))
    assert compute_accuracy(gt, path, ignore=True) == (
        0.5, 1, 2)
    assert compute_accuracy(gt, path, k=2, ignore=True) == (
        1.0, 2, 2)


def test_eval_accuracy_rejects_malformed(tmp_path, gt_and_result):
    gt, _ = gt_and_result
    path = tmp_path / 'bad.json'
    path.write_text(json.dumps({'v1': []}))
    with pytest.raises(ValueError, match='no "results"'):
        compute_accuracy(gt, path)
    path.write_text(json.dumps({'results': {'v1': [{'label': 'a'}]}}))
    with pytest.raises(ValueError, match='"label" and "score"'):
        compute_accuracy(gt, path)


def test_eval_accuracy_activitynet_ground_truth(tmp_path):
    # ActivityNet annotations are a list of labelled segments.
    gt = tmp_path / 'anet.json'
    gt.write_text(json.dumps({'database': {
        'v1': {'subset': 'validation',
               'annotations': [{'label': 'a', 'segment': [0.5, 3.0]}]},
        'v2': {'subset': 'validation',
               'annotations': [{'label': 'b', 'segment': [1.0, 2.0]}]}}}))
    res = tmp_path / 'val.json'
    res.write_text(json.dumps({'results': {
        'v1': [{'label': 'a', 'score': 0.9}],
        'v2': [{'label': 'a', 'score': 0.9}]}}))
    assert compute_accuracy(gt, res) == (0.5, 1, 2)
