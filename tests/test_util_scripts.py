"""Tests of the data-preparation and evaluation scripts in util_scripts/.

Everything runs in tmp_path on tiny fake data; ffmpeg is replaced by a
stand-in script except in the tests marked as needing the real one.
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

from util_scripts import (
    eval_accuracy,
    generate_video_hdf5,
    generate_video_jpgs,
    hmdb51_json,
    kinetics_json,
    mit_json,
    ucf101_json,
)
from util_scripts.utils import ffmpeg_command
from utils.video_accuracy import compute_accuracy

REPO = Path(__file__).resolve().parents[1]
needs_ffmpeg = pytest.mark.skipif(shutil.which('ffmpeg') is None,
                                  reason='ffmpeg not installed')


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
    with pytest.raises(SystemExit, match='no frame folder'):
        generate_video_hdf5.main([str(tmp_path), str(tmp_path / 'o'),
                                  'kinetics'])


# ------------------------------------------------------------ generate_video_jpgs

FAKE_FFMPEG = '''\
#!{python}
# Stand-in for ffmpeg: logs its arguments, writes 3 small JPEGs to the
# output pattern, and fails (after one frame) on inputs named *broken*.
import io, sys
from PIL import Image
args = sys.argv[1:]
with open({log!r}, 'a') as log:
    log.write(' '.join(args) + '\\n')
src, pattern = args[args.index('-i') + 1], args[-1]
n = 1 if 'broken' in src else 3
for i in range(1, n + 1):
    Image.new('RGB', (8, 6), (i, 0, 0)).save(pattern % i, format='JPEG')
sys.exit(1 if 'broken' in src else 0)
'''


@pytest.fixture
def fake_ffmpeg(tmp_path, monkeypatch):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    log = tmp_path / 'ffmpeg.log'
    script = bin_dir / 'ffmpeg'
    script.write_text(FAKE_FFMPEG.format(python=sys.executable, log=str(log)))
    script.chmod(0o755)
    monkeypatch.setenv('PATH', f'{bin_dir}{os.pathsep}' + os.environ['PATH'])
    return log


def test_generate_video_jpgs_layout_skip_and_failure(tmp_path, fake_ffmpeg,
                                                     capsys):
    videos = tmp_path / 'videos'
    for rel in ('Alpha/v1.avi', 'Alpha/v2.mp4', 'Bravo/v3.webm',
                'Bravo/broken.mkv', 'Bravo/notes.txt', 'Bravo/._v4.mp4'):
        (videos / rel).parent.mkdir(parents=True, exist_ok=True)
        (videos / rel).write_bytes(b'x')
    dst = tmp_path / 'jpg'
    argv = [str(videos), str(dst), 'ucf101', '--n_jobs', '2', '--fps', '25']

    with pytest.raises(SystemExit, match='1 video'):
        generate_video_jpgs.main(argv)
    assert 'broken.mkv' in capsys.readouterr().err
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob('*.jpg')) == [
        f'{v}/image_0000{i}.jpg' for v in ('Alpha/v1', 'Alpha/v2', 'Bravo/v3')
        for i in (1, 2, 3)]
    # The failed video left nothing behind, not even its temporary folder.
    assert sorted(p.name for p in (dst / 'Bravo').iterdir()) == ['v3']
    calls = fake_ffmpeg.read_text().splitlines()
    assert len(calls) == 4
    assert all('-q:v 1' in c and '-threads 1' in c and 'fps=25,scale=' in c
               for c in calls)

    # Rerun: finished videos are skipped, only the failed one is retried.
    with pytest.raises(SystemExit):
        generate_video_jpgs.main(argv)
    calls = fake_ffmpeg.read_text().splitlines()
    assert len(calls) == 5 and 'broken.mkv' in calls[-1]


def test_generate_video_jpgs_activitynet_flat(tmp_path, fake_ffmpeg):
    videos = tmp_path / 'videos'
    videos.mkdir()
    (videos / 'v_abc.mp4').write_bytes(b'x')
    generate_video_jpgs.main([str(videos), str(tmp_path / 'jpg'),
                              'activitynet', '--n_jobs', '1'])
    assert sorted(os.listdir(tmp_path / 'jpg' / 'v_abc')) == [
        'image_00001.jpg', 'image_00002.jpg', 'image_00003.jpg']
    assert '-threads' not in fake_ffmpeg.read_text()


def test_generate_video_jpgs_without_ffmpeg(tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))
    with pytest.raises(SystemExit, match='ffmpeg was not found'):
        generate_video_jpgs.main([str(tmp_path), str(tmp_path / 'o'),
                                  'kinetics'])


def test_ffmpeg_command():
    cmd = ffmpeg_command('in.mp4', 'out/image_%05d.jpg', fps=-1, size=240)
    assert cmd[cmd.index('-i') + 1] == 'in.mp4'
    # Short side 240, long side from the aspect ratio rounded to even.
    assert cmd[cmd.index('-vf') + 1] == (
        "scale='if(gt(iw,ih),-2,240)':'if(gt(iw,ih),240,-2)'")
    assert cmd[-3:] == ['-q:v', '1', 'out/image_%05d.jpg']
    assert '-vf' not in ffmpeg_command('a', 'b', fps=-1, size=0)


@needs_ffmpeg
def test_real_ffmpeg_jpgs_and_hdf5(tmp_path):
    videos = tmp_path / 'videos' / 'cls'
    videos.mkdir(parents=True)
    subprocess.run(['ffmpeg', '-nostdin', '-loglevel', 'error', '-f', 'lavfi',
                    '-i', 'testsrc=size=320x180:rate=5', '-t', '1',
                    '-pix_fmt', 'yuv420p', str(videos / 'clip.mp4')],
                   check=True)
    generate_video_jpgs.main([str(tmp_path / 'videos'), str(tmp_path / 'jpg'),
                              'kinetics', '--n_jobs', '1'])
    frames = sorted((tmp_path / 'jpg' / 'cls' / 'clip').iterdir())
    assert 4 <= len(frames) <= 6  # 1 s at 5 fps
    # Short side 240; the long one keeps 16:9, rounded to an even number.
    width, height = Image.open(frames[0]).size
    assert height == 240 and width % 2 == 0 and abs(width - 426.7) < 2

    generate_video_hdf5.main([str(tmp_path / 'videos'), str(tmp_path / 'h5'),
                              'kinetics', '--from_video', '--size', '112'])
    with h5py.File(tmp_path / 'h5' / 'cls' / 'clip.hdf5', 'r') as f:
        assert f['video'].shape == (len(frames),)
        width, height = Image.open(io.BytesIO(f['video'][0].tobytes())).size
        assert height == 112 and width % 2 == 0 and abs(width - 199.1) < 2
    assert sorted(os.listdir(tmp_path / 'h5' / 'cls')) == ['clip.hdf5']


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
