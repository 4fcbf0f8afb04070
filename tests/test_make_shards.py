"""util_scripts/make_shards.py and datasets/shards.py: tar shards of jpg, hdf5 and
video inputs, their index, determinism, resuming, and what is left out."""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from fractions import Fraction
from pathlib import Path

import av
import h5py
import pytest

from datasets import shards, storage
from datasets.shards import ShardIndex
from datasets.video import VideoClipLoader
from tests.video_files import clip_codes, videos_from_jpgs, write_coded_video, write_timed_video, write_video
from util_scripts import make_shards
from util_scripts.generate_video_hdf5 import pack_frames

ODD_ID = 'train_grow.v1%2E'  # a video id with '.' and '%': KEY escapes both
ROOT = Path(__file__).resolve().parents[1]
SHARD_SIZE = '100KB'  # four 12-frame videos per shard: 10 shards of the 39 videos


class Killed(Exception):
    pass


@pytest.fixture(scope='module')
def data(tiny_synthetic, tmp_path_factory):
    """(annotation, jpg root): tiny_synthetic with one video renamed to ODD_ID."""
    video_path, annotation = tiny_synthetic
    root = tmp_path_factory.mktemp('shards_data')
    shutil.copytree(video_path, root / 'jpg')
    os.rename(root / 'jpg' / 'grow' / 'train_grow_001', root / 'jpg' / 'grow' / ODD_ID)
    ann = json.loads(annotation.read_text())
    ann['database'] = {(ODD_ID if k == 'train_grow_001' else k): v for k, v in ann['database'].items()}
    (root / 'ann.json').write_text(json.dumps(ann))
    return root / 'ann.json', root / 'jpg'


def run(ann, root, out, *extra):
    """(exit status, stdout, stderr) of make_shards.main in this process."""
    argv = [str(ann), str(root), str(out), '--dataset', 'ucf101', '--no_progress', *extra]
    code, message = 0, ''
    try:
        make_shards.main(argv)
    except SystemExit as e:
        code, message = (e.code, '') if isinstance(e.code, int) else (1, str(e.code))
    return code, message


def contents(folder, hidden=True):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())
            if hidden or not p.name.startswith('.')}


def stats(folder, names):
    return {n: (os.stat(folder / n).st_ino, os.stat(folder / n).st_mtime_ns) for n in names}


def jpg_videos(root):
    """{REL: [JPEG bytes of each frame]} of a jpg tree."""
    return {f'{d.parent.name}/{d.name}': [f.read_bytes() for f in sorted(d.glob('image_*.jpg'))]
            for d in sorted(root.glob('*/*')) if d.is_dir()}


def member(out, index, rel, meta=False):
    e = index.entry(rel)
    with open(out / e.shard, 'rb') as f:
        f.seek(e.meta_offset if meta else e.offset)
        return f.read(e.meta_size if meta else e.size)


@pytest.fixture(scope='module')
def jpg_out(data, tmp_path_factory):
    out = tmp_path_factory.mktemp('jpg_out') / 'shards'
    assert run(*data, out, '--file_type', 'jpg', '--shard_size', SHARD_SIZE)[0] == 0
    return out


def test_jpg_shards_and_index(data, jpg_out):
    _, jpg = data
    index = ShardIndex.load(jpg_out)
    videos = jpg_videos(jpg)
    assert len(index) == len(videos) == 39 and index.file_type == 'hdf5'
    assert list(index.shard_names) == sorted(n for n in os.listdir(jpg_out) if n.endswith('.tar'))
    assert len(index.shard_names) == 10 and (jpg_out / shards.PROGRESS_NAME).is_file()
    for rel, frames in videos.items():
        with h5py.File(io.BytesIO(member(jpg_out, index, rel)), 'r') as h5:
            assert [bytes(x) for x in h5['video']] == frames
        label = None if rel.startswith('test/') else rel.split('/')[0]
        subsets = ['testing' if rel.startswith('test/') else 'validation' if '/val_' in rel else 'training']
        assert json.loads(member(jpg_out, index, rel, meta=True)) == {
            'path': rel, 'label': label, 'subsets': subsets, 'n_frames': 12, 'file_type': 'hdf5'}
    assert index.lookup(f'grow/{ODD_ID}')[0] in index.shard_names
    with pytest.raises(KeyError):
        index.lookup('grow/no_such_video')
    assert 'grow/train_grow_000' in index and 'grow' not in index


def test_tarfile_lists_every_shard(jpg_out):
    index = ShardIndex.load(jpg_out)
    info = json.loads((jpg_out / shards.INDEX_JSON).read_text())
    seen = []
    for number, entry in enumerate(info['shards']):
        path = jpg_out / entry['name']
        assert entry['size'] == path.stat().st_size and entry['sha256'] == shards.file_sha256(path)
        assert entry['size'] <= 100_000 and entry['size'] % 10240 == 0
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        assert len(members) == entry['members'] == 2 * entry['n_videos']
        for payload, meta in zip(members[::2], members[1::2]):
            rel = shards.unescape_key(payload.name[:-len('.hdf5')])
            assert json.loads(member(jpg_out, index, rel, meta=True))['path'] == rel
            assert payload.name == shards.escape_key(rel) + '.hdf5' and meta.name == shards.escape_key(rel) + '.json'
            e = index.entry(rel)
            assert (e.shard, e.offset, e.size, e.meta_offset, e.meta_size) == (
                entry['name'], payload.offset_data, payload.size, meta.offset_data, meta.size)
            for m in (payload, meta):
                assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.type) == (
                    0, 0, 0, '', '', 0o644, tarfile.REGTYPE)
            seen.append(rel)
        assert shards.read_shard_rows(path, number) == [
            {'path': r, 'ext': 'hdf5', 'shard': number, **{k: getattr(index.entry(r), k) for k in (
                'offset', 'size', 'meta_offset', 'meta_size', 'n_frames')}} for r in seen[-entry['n_videos']:]]
    assert seen == sorted(seen) == list(index.paths)
    assert shards.escape_key(f'grow/{ODD_ID}') == 'grow/train_grow%2Ev1%252E'


def test_webdataset_reads_the_shards(jpg_out):
    webdataset = pytest.importorskip('webdataset')
    index = ShardIndex.load(jpg_out)
    urls = [str(jpg_out / name) for name in index.shard_names]
    samples = list(webdataset.WebDataset(urls, shardshuffle=False))
    assert [s['__key__'] for s in samples] == [shards.escape_key(str(p)) for p in index.paths]
    for sample in samples:
        rel = shards.unescape_key(sample['__key__'])
        assert json.loads(sample['json'])['path'] == rel
        assert sample['hdf5'] == member(jpg_out, index, rel)


def test_hdf5_input_gives_the_same_shards(data, jpg_out, tmp_path):
    """hdf5 files packed by generate_video_hdf5 are copied as they are: the same bytes
    as the jpg folders packed here."""
    ann, jpg = data
    for folder in sorted(p for p in jpg.glob('*/*') if p.is_dir()):
        (tmp_path / 'h5' / folder.parent.name).mkdir(parents=True, exist_ok=True)
        assert pack_frames(folder, tmp_path / 'h5' / folder.parent.name / f'{folder.name}.hdf5') is None
    out = tmp_path / 'out'
    assert run(ann, tmp_path / 'h5', out, '--file_type', 'hdf5', '--shard_size', SHARD_SIZE) == (0, '')
    assert contents(out, hidden=False) == contents(jpg_out, hidden=False)
    index = ShardIndex.load(out)
    rel = f'grow/{ODD_ID}'
    assert member(out, index, rel) == (tmp_path / 'h5' / f'{rel}.hdf5').read_bytes()


def test_video_input(data, tmp_path):
    ann, jpg = data
    videos = videos_from_jpgs(jpg, tmp_path / 'videos', other_ext={'grow': '.avi'})
    out = tmp_path / 'out'
    assert run(ann, videos, out, '--file_type', 'video', '--shard_size', '64KiB', '--workers', '2') == (0, '')
    index = ShardIndex.load(out)
    assert index.file_type == 'video' and len(index) == 39 and len(index.shard_names) > 1
    for rel in index.paths:
        e = index.entry(str(rel))
        assert e.ext == ('avi' if rel.startswith('grow/') else 'mp4') and e.n_frames == 12
        assert member(out, index, str(rel)) == (videos / f'{rel}.{e.ext}').read_bytes()
        assert json.loads(member(out, index, str(rel), meta=True))['file_type'] == 'video'


def test_same_bytes_with_two_workers(data, jpg_out, tmp_path):
    assert run(*data, tmp_path, '--file_type', 'jpg', '--shard_size', SHARD_SIZE, '--workers', '2')[0] == 0
    assert contents(tmp_path) == contents(jpg_out)


def test_a_video_larger_than_the_shard_size_gets_its_own(data, tmp_path):
    assert run(*data, tmp_path, '--file_type', 'jpg', '--shard_size', '1') == (0, '')
    info = json.loads((tmp_path / shards.INDEX_JSON).read_text())
    assert len(info['shards']) == 39 and {s['n_videos'] for s in info['shards']} == {1}


def test_resume_after_interruption(data, jpg_out, tmp_path, monkeypatch):
    """Killed while writing shard 2: the rerun keeps shards 0 and 1 and writes the
    rest, the bytes those of an uninterrupted run; a damaged shard is written again."""
    real, calls = make_shards.prepare, []

    def prepare(job, fail_at=None):
        calls.append(job[0])
        if len(calls) == fail_at:
            raise Killed
        return real(job)

    monkeypatch.setattr(make_shards, 'prepare', lambda job: prepare(job, fail_at=11))
    with pytest.raises(Killed):
        run(*data, tmp_path, '--file_type', 'jpg', '--shard_size', SHARD_SIZE)
    assert sorted(os.listdir(tmp_path)) == [shards.PROGRESS_NAME, 'shard-000000.tar', 'shard-000001.tar',
                                            'shard-000002.tar.tmp']
    before = stats(tmp_path, ['shard-000000.tar', 'shard-000001.tar'])
    calls.clear()
    monkeypatch.setattr(make_shards, 'prepare', prepare)
    assert run(*data, tmp_path, '--file_type', 'jpg', '--shard_size', SHARD_SIZE) == (0, '')
    assert len(calls) == 39 - 8 and contents(tmp_path) == contents(jpg_out)
    assert stats(tmp_path, before) == before
    with open(tmp_path / 'shard-000003.tar', 'r+b') as f:  # damage shard 3
        f.seek(600)
        f.write(b'X')
    before = stats(tmp_path, ['shard-000000.tar', 'shard-000001.tar', 'shard-000002.tar'])
    calls.clear()
    assert run(*data, tmp_path, '--file_type', 'jpg', '--shard_size', SHARD_SIZE) == (0, '')
    assert len(calls) == 39 - 12 and contents(tmp_path) == contents(jpg_out)
    assert stats(tmp_path, before) == before


def test_unreadable_videos_are_named(data, tmp_path, capsys):
    ann, jpg = data
    shutil.copytree(jpg, tmp_path / 'jpg')
    shutil.rmtree(tmp_path / 'jpg' / 'move_up' / 'train_move_up_001')  # missing
    (tmp_path / 'jpg' / 'shrink' / 'val_shrink_000' / 'image_00005.jpg').unlink()  # a gap
    for f in (tmp_path / 'jpg' / 'test' / 'test_001').iterdir():  # no frames
        f.unlink()
    shutil.rmtree(tmp_path / 'jpg' / 'grow' / 'train_grow_002')  # no segment, no video
    annotation = json.loads(ann.read_text())
    del annotation['database']['train_grow_002']['annotations']['segment']
    (tmp_path / 'ann.json').write_text(json.dumps(annotation))
    code, message = run(tmp_path / 'ann.json', tmp_path / 'jpg', tmp_path / 'out', '--file_type', 'jpg')
    err = capsys.readouterr().err
    assert code == 1 and message.startswith('error: 4 video(s) could not be read')
    for name, why in (('move_up/train_move_up_001', 'missing'), ('shrink/val_shrink_000', 'image_00005.jpg'),
                      ('test/test_001', 'no frames'), ('grow/train_grow_002', 'no segment')):
        assert f'  {name}: ' in err and why in err.split(f'  {name}: ')[1].splitlines()[0]
    index = ShardIndex.load(tmp_path / 'out')
    assert len(index) == 35 and 'move_up/train_move_up_001' not in index and len(index.shard_names) == 1


def test_left_out_video_is_written_once_back(data, jpg_out, tmp_path, monkeypatch):
    """A video missing in the first run is read by the rerun once it is there, and the
    shards from its position on are written again (those before it are kept)."""
    ann, jpg = data
    shutil.copytree(jpg, tmp_path / 'jpg')
    gone = tmp_path / 'jpg' / 'move_left' / 'train_move_left_001'  # position 13: in shard 3
    shutil.move(gone, tmp_path / 'kept_aside')
    out = tmp_path / 'out'
    code, message = run(ann, tmp_path / 'jpg', out, '--file_type', 'jpg', '--shard_size', SHARD_SIZE)
    assert code == 1 and (out / shards.INDEX_JSON).is_file()
    shutil.move(tmp_path / 'kept_aside', gone)
    before = stats(out, [f'shard-00000{i}.tar' for i in range(3)])
    assert run(ann, tmp_path / 'jpg', out, '--file_type', 'jpg', '--shard_size', SHARD_SIZE) == (0, '')
    assert contents(out) == contents(jpg_out) and stats(out, before) == before


def test_activitynet_segments_give_one_video(tmp_path, data):
    _, jpg = data
    for i, src in enumerate(['grow/train_grow_000', 'shrink/train_shrink_000', 'test/test_000']):
        shutil.copytree(jpg / src, tmp_path / 'jpg' / f'v_vid{i}')
    segment = {'label': 'Grow', 'segment': [0.0, 0.4]}
    database = {
        'vid0': {'subset': 'training', 'fps': 25, 'n_frames': 12,
                 'annotations': [segment, {'label': 'Shrink', 'segment': [0.08, 0.48]}]},
        'vid1': {'subset': 'validation', 'fps': 25, 'n_frames': 12,
                 'annotations': [{'label': 'Shrink', 'segment': [0.0, 0.44]}]},
        'vid2': {'subset': 'testing', 'fps': 25, 'n_frames': 12, 'annotations': []}}
    taxonomy = [{'nodeId': 0, 'nodeName': 'Root', 'parentId': None},
                {'nodeId': 1, 'nodeName': 'Grow', 'parentId': 0}, {'nodeId': 2, 'nodeName': 'Shrink', 'parentId': 0}]
    (tmp_path / 'anet.json').write_text(json.dumps({'taxonomy': taxonomy, 'database': database}))
    argv = [str(tmp_path / 'anet.json'), str(tmp_path / 'jpg'), str(tmp_path / 'out'), '--dataset', 'activitynet',
            '--no_progress']
    make_shards.main(argv)
    index = ShardIndex.load(tmp_path / 'out')
    assert list(index.paths) == ['v_vid0', 'v_vid1', 'v_vid2'] and len(index.shard_names) == 1
    metas = [json.loads(member(tmp_path / 'out', index, p, meta=True)) for p in index.paths]
    assert [(m['label'], m['subsets'], m['n_frames']) for m in metas] == [
        ('Grow', ['training'], 12), ('Shrink', ['validation'], 12), (None, ['testing'], 12)]


@pytest.mark.parametrize('change', ['no_annotation', 'root_not_folder', 'bad_size', 'zero_size', 'workers',
                                    'file_type', 'misspelt', 'not_json', 'out_is_file'])
def test_bad_arguments(data, tmp_path, capsys, change):
    ann, jpg = data
    (tmp_path / 'file').write_text('{')
    args = {'ann': str(ann), 'root': str(jpg), 'out': str(tmp_path / 'out')}
    extra = []
    if change in ('no_annotation', 'not_json'):
        args['ann'] = str(tmp_path / ('missing.json' if change == 'no_annotation' else 'file'))
    elif change in ('root_not_folder', 'out_is_file'):
        args['root' if change == 'root_not_folder' else 'out'] = str(tmp_path / 'file')
    else:
        extra = {'bad_size': ['--shard_size', '12XB'], 'zero_size': ['--shard_size', '0'],
                 'workers': ['--workers', '0'], 'file_type': ['--file_type', 'png'],
                 'misspelt': ['--shard-size', '1GB']}[change]
    with pytest.raises(SystemExit) as e:
        make_shards.main([*args.values(), '--dataset', 'ucf101', *extra])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith('error: ') and err.count('\n') == 1, err
    assert not (tmp_path / 'out').exists()


def test_index_helpers(jpg_out):
    loaded = ShardIndex.load(jpg_out)
    again = ShardIndex.from_bytes((jpg_out / 'index.json').read_bytes(), (jpg_out / 'index.npz').read_bytes())
    assert list(again.paths) == list(loaded.paths) and again.shard_names == loaded.shard_names
    assert again.paths.dtype.kind == 'U'
    for rel in ('a.b%c/d.e', '%2E', 'plain/name'):
        key = shards.escape_key(rel)
        assert '.' not in key and shards.unescape_key(key) == rel
    sizes = {'1GB': 10**9, '500MB': 500 * 10**6, '64KB': 64000, '2GiB': 2 * 2**30, '4096': 4096, '1.5M': 1_500_000}
    assert {k: make_shards.parse_size(k) for k in sizes} == sizes
    name = 'klasse/' + 'vidéo_' * 30 + '.json'  # over 100 bytes, not ASCII: a GNU long-name member
    header = shards.tar_header(name, 3)
    with tarfile.open(fileobj=io.BytesIO(header + b'abc' + shards.block_padding(3) + shards.archive_end(
            len(header) + 512))) as tar:
        (info,) = tar.getmembers()
        assert (info.name, info.offset_data, tar.extractfile(info).read()) == (name, len(header), b'abc')
    with pytest.raises(Exception, match='not a video-shards index'):
        ShardIndex.from_bytes(b'{"format": "other"}', (jpg_out / 'index.npz').read_bytes())



def test_unreadable_files(tmp_path, data, capsys):
    """An hdf5 file that is no hdf5 file, one without a 'video' dataset, a video file
    that does not decode, a missing one: left out and named; the readable ones written."""
    _, jpg = data
    (tmp_path / 'h5' / 'grow').mkdir(parents=True)
    assert pack_frames(jpg / 'grow' / 'train_grow_000', tmp_path / 'h5' / 'grow' / 'good.hdf5') is None
    (tmp_path / 'h5' / 'grow' / 'garbage.hdf5').write_bytes(b'not an hdf5 file' * 64)
    with h5py.File(tmp_path / 'h5' / 'grow' / 'other.hdf5', 'w') as h5:
        h5.create_dataset('frames', data=[1, 2, 3])
    write_video(tmp_path / 'videos' / 'grow' / 'good.mp4')
    (tmp_path / 'videos' / 'grow' / 'garbage.mp4').write_bytes(bytes(range(256)) * 16)
    database = {name: {'subset': 'training', 'annotations': {'label': 'grow', 'segment': [0, 12]}}
                for name in ('good', 'garbage', 'other')}
    (tmp_path / 'ann.json').write_text(json.dumps({'labels': ['grow'], 'database': database}))
    for file_type, root in (('hdf5', 'h5'), ('video', 'videos')):
        out = tmp_path / f'out_{file_type}'
        code, message = run(tmp_path / 'ann.json', tmp_path / root, out, '--file_type', file_type)
        err = capsys.readouterr().err
        assert code == 1 and message.startswith('error: 2 video(s) could not be read'), message
        assert '  grow/garbage: ' in err and '  grow/other: ' in err, err
        assert list(ShardIndex.load(out).paths) == ['grow/good']
    assert "no 'video' dataset" in run(tmp_path / 'ann.json', tmp_path / 'h5', tmp_path / 'out_h5',
                                       '--file_type', 'hdf5')[1] + capsys.readouterr().err


@pytest.mark.slow  # the command in its own interpreter
def test_command_line(data, jpg_out, tmp_path):
    """As a command: the summary on stdout, and off a terminal (a job's log) no progress
    bar and its redraws; bad arguments answered before the heavy imports."""
    ann, jpg = data
    command = [sys.executable, '-m', 'util_scripts.make_shards', str(ann), str(jpg), str(tmp_path / 'out'),
               '--dataset', 'ucf101', '--shard_size', SHARD_SIZE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith('39 video(s) written to 10 shard(s)')
    assert '39/39' not in done.stderr and '\r' not in done.stdout + done.stderr
    assert contents(tmp_path / 'out') == contents(jpg_out)
    done = subprocess.run(command + ['--workers', 'x'], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.startswith('error: ') and done.stderr.count('\n') == 1


# ---------------------------------------------------------------- --reencode

REENCODED = {'grow/a': ('.mp4', 'libx264', 13), 'grow/b': ('.avi', 'mpeg4', 9), 'shrink/c': ('.mkv', 'libx264', 11)}


@pytest.fixture(scope='module')
def coded(tmp_path_factory):
    """(annotation, video root) of three code_image videos, a keyframe only at the start
    (gop 250), one of them .avi, plus an undecodable shrink/garbage.mp4."""
    root = tmp_path_factory.mktemp('coded')
    for rel, (suffix, codec, n) in REENCODED.items():
        write_coded_video(root / 'videos' / f'{rel}{suffix}', codec, n, gop=250)
    (root / 'videos' / 'shrink' / 'garbage.mp4').write_bytes(bytes(range(256)) * 16)
    database = {rel.split('/')[1]: {'subset': 'training', 'annotations': {'label': rel.split('/')[0],
                                                                          'segment': [0, 8]}}
                for rel in [*REENCODED, 'shrink/garbage']}
    (root / 'ann.json').write_text(json.dumps({'labels': ['grow', 'shrink'], 'database': database}))
    return root / 'ann.json', root / 'videos'


def reencode_run(coded, out, *extra):
    return run(*coded, out, '--file_type', 'video', '--reencode', '--shard_size', '20KB', *extra)


@pytest.fixture(scope='module')
def gop4_out(coded, tmp_path_factory):
    """--reencode --gop 4; the temporary files in a folder of their own (checked empty)."""
    out = tmp_path_factory.mktemp('gop4') / 'shards'
    temp = out.parent / 'temp'
    temp.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, 'tempdir', str(temp))
        code, message = reencode_run(coded, out, '--gop', '4')
    assert code == 1 and message.startswith('error: 1 video(s) could not be read'), message
    assert os.listdir(temp) == []
    return out


def test_reencode_keeps_every_frame_with_a_keyframe_every_gop(coded, gop4_out, capsys):
    store = storage.open_shards(gop4_out)
    index = store.index()
    assert index.file_type == 'video' and list(index.paths) == list(REENCODED)
    assert len(index.shard_names) > 1
    for rel, (_, _, n) in REENCODED.items():
        e = index.entry(rel)
        assert e.ext == 'mp4' and e.n_frames == n
        assert json.loads(member(gop4_out, index, rel, meta=True))['n_frames'] == n
        clip = VideoClipLoader(threads=1, store=store)(rel, list(range(n)))  # as training reads it
        assert clip_codes(clip) == list(range(n))
        with av.open(io.BytesIO(member(gop4_out, index, rel))) as container:
            keys = [i for i, f in enumerate(container.decode(video=0)) if f.key_frame]
        assert keys[0] == 0 and max(b - a for a, b in zip(keys, keys[1:] + [n])) <= 4, keys


def test_reencode_names_a_video_it_cannot_encode(coded, tmp_path, capsys):
    code, message = reencode_run(coded, tmp_path / 'out', '--workers', '2')
    err = capsys.readouterr().err
    assert code == 1 and message.startswith('error: 1 video(s) could not be read'), message
    assert '  shrink/garbage: ' in err and 'garbage.mp4' in err, err
    assert len(ShardIndex.load(tmp_path / 'out')) == 3


@pytest.mark.parametrize('extra, named', [
    (['--file_type', 'jpg', '--reencode'], ['--reencode', '--file_type video']),
    (['--file_type', 'video', '--reencode', '--gop', '0'], ['--gop 0']),
    (['--file_type', 'video', '--reencode', '--codec', 'nonsense'], ['--codec nonsense']),
    (['--file_type', 'video', '--gop', '8'], ['--gop', 'without --reencode'])])
def test_reencode_option_errors(coded, tmp_path, capsys, extra, named):
    with pytest.raises(SystemExit) as e:
        make_shards.main([*map(str, coded), str(tmp_path / 'out'), '--dataset', 'ucf101', *extra])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith('error: ') and err.count('\n') == 1, err
    assert all(n in err for n in named), err
    assert not (tmp_path / 'out').exists()


def test_reencode_rerun_takes_up_shards_of_the_same_settings_only(coded, gop4_out, tmp_path, capsys):
    out = tmp_path / 'out'
    shutil.copytree(gop4_out, out)
    names = [n for n in os.listdir(out) if n.endswith('.tar')]
    before = stats(out, names)
    assert reencode_run(coded, out, '--gop', '4')[0] == 1
    assert 'taking up' in capsys.readouterr().out and stats(out, names) == before
    assert contents(out) == contents(gop4_out)
    assert reencode_run(coded, out, '--gop', '8')[0] == 1
    assert 'taking up' not in capsys.readouterr().out
    assert all(stats(out, [n])[n] != before[n] for n in names)


def test_reencode_same_bytes_with_two_workers(coded, gop4_out, tmp_path):
    """Also on another machine: x264 encodes on one thread, as its bytes depend on the
    thread count (its own choice for 160x128 frames is 2 threads on 2 cores)."""
    assert reencode_run(coded, tmp_path / 'out', '--gop', '4', '--workers', '2')[0] == 1
    assert contents(tmp_path / 'out') == contents(gop4_out)
    src = write_timed_video(tmp_path / 'big.mp4', 'libx264', list(range(6)), Fraction(1, 25), size=(160, 128))
    payload, n = make_shards.reencoded_payload(str(src), dict(gop=4, short_side=None, codec='libx264', crf=23))
    assert n == 6 and b' threads=1 ' in payload  # the settings x264 writes into the stream
