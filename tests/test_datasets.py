"""Annotation reader, clip loaders and data sets (tiny data written to
tmp_path); then the dataset.py and main.py glue: the same temporal stride in
training, validation and inference, per-rank random streams, small subsets,
linear lr scaling, AMP."""
import io
import json
import os
import pickle
import warnings

import h5py
import numpy as np
import pytest
import torch
from torchvision.io import encode_jpeg

import dataset
import main
from datasets import loader as loader_module
from datasets.annotation import VideoRecord, load_annotations, load_class_names
from datasets.frame_check import check_videos
from datasets.loader import Hdf5ClipLoader, Hdf5FlowLoader, JpgClipLoader, make_loader
from datasets.spatial_transforms import build_eval_transform, build_train_transform
from datasets.temporal_transforms import SlidingWindow, TemporalEvenCrop, TemporalRandomCrop
from datasets.videodataset import VideoClipDataset, VideoWindowDataset
from opts import parse_opts
from tests.conftest import tiny_args
from utils.distributed import DistContext
from utils.errors import DataError
from utils.logs import read_tsv
from utils.resumable_data import epoch_seed, restart_seed, sample_seed

SIZE = 32


def colour(p):
    """Solid colour of frame position p (distinct per frame, far from JPEG clipping)."""
    return (20 + 10 * p, 220 - 10 * p, 60 + 5 * p)


def jpeg_frames(n, size=SIZE, gray=False):
    out = []
    for p in range(n):
        if gray:
            img = torch.full((1, size, size), 30 + 10 * p, dtype=torch.uint8)
        else:
            img = torch.tensor(colour(p), dtype=torch.uint8).view(3, 1, 1).expand(3, size, size)
        out.append(encode_jpeg(img.contiguous(), quality=95).numpy().tobytes())
    return out


def write_jpg_video(folder, n, size=SIZE):
    folder.mkdir(parents=True, exist_ok=True)
    for p, data in enumerate(jpeg_frames(n, size)):
        (folder / f'image_{p + 1:05d}.jpg').write_bytes(data)
    return folder


def write_hdf5_video(path, n, size=SIZE, flow=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    vlen = h5py.vlen_dtype(np.uint8)
    with h5py.File(path, 'w') as f:
        keys = ('video_u', 'video_v') if flow else ('video',)
        for key in keys:
            ds = f.create_dataset(key, (n,), dtype=vlen)
            for p, data in enumerate(jpeg_frames(n, size, gray=flow)):
                ds[p] = np.frombuffer(data, dtype=np.uint8)
    return path


def write_annotation(path, database, labels=('walk', 'run')):
    path.write_text(json.dumps({'labels': list(labels), 'database': database}))
    return path


def assert_solid(clip_frame, rgb, tol=4):
    means = clip_frame.float().mean(dim=(1, 2))
    assert torch.allclose(means, torch.tensor(rgb, dtype=torch.float32), atol=tol), \
        (means.tolist(), rgb)


# ----------------------------------------------------------------------------- annotation

def test_one_based_jpg_and_zero_based_hdf5_segments_use_every_frame(tmp_path):
    ann = write_annotation(tmp_path / 'a.json', {
        'jpgvid': {'subset': 'training', 'annotations': {'label': 'run', 'segment': [1, 9]}},
        'h5vid': {'subset': 'training', 'annotations': {'label': 'walk', 'segment': [0, 8]}},
        'other': {'subset': 'validation', 'annotations': {'label': 'walk', 'segment': [1, 5]}},
    })
    records, names = load_annotations(ann, 'training', tmp_path / 'v', 'kinetics')
    assert names == ['walk', 'run']
    by_id = {r.video_id: r for r in records}
    assert set(by_id) == {'jpgvid', 'h5vid'}
    for r in records:
        assert list(r.positions) == list(range(8))  # last frame (position 7) included
        assert r.n_frames == 8
    assert by_id['jpgvid'].segment == (1, 9) and by_id['h5vid'].segment == (0, 8)
    assert by_id['jpgvid'].label == 1 and by_id['h5vid'].label == 0
    assert by_id['jpgvid'].path == str(tmp_path / 'v' / 'run' / 'jpgvid')
    records, _ = load_annotations(ann, 'training', tmp_path / 'v', 'ucf101', file_type='hdf5')
    assert {r.path for r in records} == {str(tmp_path / 'v' / 'run' / 'jpgvid.hdf5'),
                                         str(tmp_path / 'v' / 'walk' / 'h5vid.hdf5')}


def test_testing_subset_path_label_and_missing_segment(tmp_path):
    write_jpg_video(tmp_path / 'v' / 'test' / 'counted', 3)
    ann = write_annotation(tmp_path / 'a.json', {
        't1': {'subset': 'testing', 'annotations': {'segment': [1, 6]}},
        'counted': {'subset': 'testing', 'annotations': {}},
        'gone': {'subset': 'testing', 'annotations': {}},
        'rel': {'subset': 'testing', 'annotations': {'segment': [1, 3]},
                'video_path': 'elsewhere/rel'},
        'abs': {'subset': 'testing', 'annotations': {'segment': [1, 3]},
                'video_path': str(tmp_path / 'abs_dir')},
    })
    with pytest.warns(UserWarning, match='skipped 1'):
        records, _ = load_annotations(ann, 'testing', tmp_path / 'v', 'kinetics')
    by_id = {r.video_id: r for r in records}
    assert set(by_id) == {'t1', 'counted', 'rel', 'abs'}
    assert all(r.label == -1 for r in records)
    assert by_id['t1'].path == str(tmp_path / 'v' / 'test' / 't1')
    assert by_id['t1'].n_frames == 5
    assert by_id['counted'].n_frames == 3 and by_id['counted'].first_frame == 0
    assert by_id['rel'].path == str(tmp_path / 'v' / 'elsewhere' / 'rel')
    assert by_id['abs'].path == str(tmp_path / 'abs_dir')


def _raises_naming(fn, *needles):
    with pytest.raises(DataError) as info:
        fn()
    for needle in needles:
        assert str(needle) in str(info.value), (needle, str(info.value))
    return str(info.value)


def test_annotation_errors_name_file_and_video(tmp_path):
    v = tmp_path / 'v'
    missing = tmp_path / 'nope.json'
    _raises_naming(lambda: load_annotations(missing, 'training', v, 'kinetics'), missing)

    no_labels = tmp_path / 'nolabels.json'
    no_labels.write_text(json.dumps({'database': {}}))
    _raises_naming(lambda: load_annotations(no_labels, 'training', v, 'kinetics'),
                   no_labels, '"labels"')
    no_db = tmp_path / 'nodb.json'
    no_db.write_text(json.dumps({'labels': ['a']}))
    _raises_naming(lambda: load_annotations(no_db, 'training', v, 'kinetics'), no_db,
                   '"database"')

    bad_label = write_annotation(tmp_path / 'badlabel.json', {
        'vid42': {'subset': 'training', 'annotations': {'label': 'swim', 'segment': [1, 5]}}})
    _raises_naming(lambda: load_annotations(bad_label, 'training', v, 'kinetics'),
                   bad_label, 'vid42', 'swim')

    only_train = write_annotation(tmp_path / 'train_only.json', {
        'x': {'subset': 'training', 'annotations': {'label': 'run', 'segment': [1, 5]}}})
    msg = _raises_naming(lambda: load_annotations(only_train, 'validation', v, 'kinetics'),
                         "subset 'validation' of", only_train, 'has no videos')
    assert 'subsets present: training' in msg

    empty_seg = write_annotation(tmp_path / 'emptyseg.json', {
        'vid7': {'subset': 'training', 'annotations': {'label': 'run', 'segment': [5, 5]}}})
    _raises_naming(lambda: load_annotations(empty_seg, 'training', v, 'kinetics'),
                   empty_seg, 'vid7')
    with pytest.raises(DataError, match='unknown dataset'):
        load_annotations(only_train, 'training', v, 'youtube8m')


def test_every_annotation_reader_fails_alike(tmp_path):
    """Training, the evaluation (datasets/video_accuracy.py) and predict.py read an
    annotation file through one reader: one error type, one wording."""
    from classify import annotation_labels
    from datasets.video_accuracy import load_ground_truth
    readers = (lambda p: load_annotations(p, 'training', tmp_path, 'kinetics'),
               load_class_names, lambda p: load_ground_truth(p, 'training'), annotation_labels)
    broken = tmp_path / 'broken.json'
    broken.write_text('{"labels": [')
    no_db = tmp_path / 'nodb.json'
    no_db.write_text(json.dumps({'labels': ['a']}))
    listed = tmp_path / 'list.json'
    listed.write_text(json.dumps({'labels': ['a'], 'database': []}))
    for path, needle in ((tmp_path / 'nope.json', 'not found'), (broken, 'is not valid JSON'),
                         (no_db, 'has no "database" key'), (listed, '"database" must be')):
        for read in readers:
            _raises_naming(lambda: read(path), f'annotation file {path}', needle)
    anet = tmp_path / 'anet.json'
    anet.write_text(json.dumps({'taxonomy': [], 'database': {
        'a': {'subset': 'validation', 'annotations': [{'label': 'Surf', 'segment': [0, 1]},
                                                      {'label': 'Cook', 'segment': [1, 2]}]},
        'b': {'subset': 'validation', 'annotations': []}, 'c': 'not an entry'}}))
    assert annotation_labels(anet) == {'a': 'Surf'}
    assert load_ground_truth(anet, 'validation') == ({'a': 'Surf'}, [])


def test_load_class_names_both_formats(tmp_path):
    ann = write_annotation(tmp_path / 'a.json', {}, labels=('b', 'a', 'c'))
    assert load_class_names(ann) == ['b', 'a', 'c']
    anet = tmp_path / 'anet.json'
    anet.write_text(json.dumps({'taxonomy': [
        {'nodeId': 1, 'nodeName': 'Root', 'parentId': None, 'parentName': None},
        {'nodeId': 2, 'nodeName': 'Sports', 'parentId': 1, 'parentName': 'Root'},
        {'nodeId': 3, 'nodeName': 'Surfing', 'parentId': 2, 'parentName': 'Sports'},
        {'nodeId': 4, 'nodeName': 'Cooking', 'parentId': 1, 'parentName': 'Root'}],
        'database': {}}))
    assert load_class_names(anet) == ['Surfing', 'Cooking']


def test_activitynet_segments_in_seconds(tmp_path):
    anet = tmp_path / 'anet.json'
    anet.write_text(json.dumps({'taxonomy': [
        {'nodeId': 1, 'nodeName': 'Root', 'parentId': None},
        {'nodeId': 3, 'nodeName': 'Surfing', 'parentId': 1},
        {'nodeId': 4, 'nodeName': 'Cooking', 'parentId': 1}],
        'database': {
            'abc': {'subset': 'training', 'fps': 10, 'duration': 5.0, 'annotations': [
                {'label': 'Cooking', 'segment': [0.0, 1.0]},     # frames 1..10 -> 10 frames
                {'label': 'Surfing', 'segment': [2.05, 2.5]},    # 21..25 -> 5 frames: dropped
                {'label': 'Surfing', 'segment': [3.0, 9.0]}]},   # clipped at 50 frames
            'tst': {'subset': 'testing', 'fps': 10, 'duration': 2.0, 'annotations': []}}}))
    records, names = load_annotations(anet, 'training', tmp_path / 'v', 'activitynet')
    assert names == ['Surfing', 'Cooking']
    assert [(r.first_frame, r.n_frames, r.label, r.segment) for r in records] == \
        [(0, 10, 1, (1, 11)), (30, 20, 0, (31, 51))]
    assert records[0].path == str(tmp_path / 'v' / 'v_abc')
    records, _ = load_annotations(anet, 'testing', tmp_path / 'v', 'activitynet')
    assert [(r.video_id, r.first_frame, r.n_frames, r.label) for r in records] == \
        [('tst', 0, 20, -1)]


def test_check_videos(tmp_path):
    write_jpg_video(tmp_path / 'v' / 'run' / 'good', 8)
    write_jpg_video(tmp_path / 'v' / 'run' / 'short', 7)
    good = VideoRecord('good', str(tmp_path / 'v' / 'run' / 'good'), 0, 8, 1, (1, 9))
    short = VideoRecord('short', str(tmp_path / 'v' / 'run' / 'short'), 0, 8, 1, (1, 9))
    absent = VideoRecord('absent', str(tmp_path / 'v' / 'run' / 'absent'), 0, 8, 1, (1, 9))
    check_videos([good], 'jpg')
    msg = _raises_naming(lambda: check_videos([good, short, absent], 'jpg'),
                         'short', 'image_00008.jpg', 'absent', '2 of 3', 're-extract')
    assert f'{good.path}:' not in msg

    write_hdf5_video(tmp_path / 'h' / 'ok.hdf5', 8)
    ok = VideoRecord('ok', str(tmp_path / 'h' / 'ok.hdf5'), 0, 8, 0, (0, 8))
    too_long = VideoRecord('ok', str(tmp_path / 'h' / 'ok.hdf5'), 2, 8, 0, (2, 10))
    check_videos([ok], 'hdf5')
    _raises_naming(lambda: check_videos([ok, too_long], 'hdf5'), 'ok.hdf5', 'has 8')
    # many videos (thread pool path): one bad one among 80 is found
    many = []
    for i in range(80):
        folder = tmp_path / 'many' / f'm{i}'
        folder.mkdir(parents=True)
        if i != 37:
            (folder / 'image_00002.jpg').write_bytes(b'x')
        many.append(VideoRecord(f'm{i}', str(folder), 0, 2, 0, (1, 3)))
    _raises_naming(lambda: check_videos(many, 'jpg'), 'm37', '1 of 80')


def test_one_frame_counter_for_every_format(tmp_path):
    """datasets/formats.py: what annotation.py, predict.py and util_scripts count."""
    from datasets.formats import frame_count, frame_number, video_files, video_kind
    from tests.video_files import write_video
    jpg = write_jpg_video(tmp_path / 'jpg', 5)
    (jpg / 'image_x.jpg').write_bytes(b'')  # not a frame file name
    (jpg / 'notes.txt').write_text('')
    hdf5 = write_hdf5_video(tmp_path / 'h.hdf5', 4)
    flow = write_hdf5_video(tmp_path / 'f.hdf5', 3, flow=True)
    with h5py.File(tmp_path / 'empty.hdf5', 'w') as f:
        f.create_dataset('other', data=np.zeros(2))
    video = write_video(tmp_path / 'clip.MP4', n_frames=6)
    assert [frame_count(jpg, 'jpg'), frame_count(hdf5, 'hdf5'), frame_count(flow, 'hdf5'),
            frame_count(video, 'video')] == [5, 4, 3, 6]
    assert frame_count(tmp_path / 'empty.hdf5', 'hdf5') is None
    for path, kind in ((tmp_path / 'nope', 'jpg'), (tmp_path / 'nope.hdf5', 'hdf5'),
                       (tmp_path / 'nope.mp4', 'video')):
        with pytest.raises(OSError):
            frame_count(path, kind)
    assert [frame_number('image_00012.jpg'), frame_number('image_x.jpg'),
            frame_number('img_00001.jpg')] == [12, None, None]
    assert [video_kind(jpg), video_kind(hdf5), video_kind(video), video_kind(tmp_path / 'a.txt'),
            video_kind(tmp_path / 'b.h5'), video_kind(tmp_path / 'b.h5', ('.hdf5',))] == \
        ['jpg', 'hdf5', 'video', None, 'hdf5', None]
    assert video_files(tmp_path) == {'clip': 'clip.MP4'}  # in any case; a second clip.*: refused



def test_two_videos_of_one_name_in_a_folder_are_refused_by_the_loader_and_the_builders(tmp_path):
    """clip.MP4 and clip.avi in one class folder: the builders counted clip.avi (9 frames:
    there is no exact clip.mp4 on a case-sensitive disk) and the loader read clip.MP4
    (.mp4 first, in any case; 6 frames). Both refuse now, naming the two files."""
    from datasets.formats import video_files
    from tests.video_files import write_video
    from util_scripts import folder_json
    from util_scripts.utils import add_segments
    root = tmp_path / 'v'
    write_video(root / 'cls' / 'clip.MP4', n_frames=6)
    write_video(root / 'cls' / 'clip.avi', n_frames=9)
    write_video(root / 'cls' / 'other.mp4', n_frames=5)
    (root / 'cls' / 'other.hdf5').write_bytes(b'')  # another kind: not a second video
    (root / 'cls' / '._other.mp4').write_bytes(b'')  # a macOS resource fork: ignored
    _raises_naming(lambda: video_files(root / 'cls'), 'clip.MP4 and clip.avi', 'rename or remove one')
    annotation = tmp_path / 'a.json'
    entry = {'subset': 'training', 'annotations': {'label': 'cls', 'segment': [0, 6]}}
    annotation.write_text(json.dumps({'labels': ['cls'], 'database': {'other': entry}}))
    _raises_naming(lambda: load_annotations(annotation, 'training', root, 'kinetics', file_type='video'),
                   'clip.MP4 and clip.avi')
    database = {'clip': {'subset': 'training', 'annotations': {'label': 'cls'}}}
    for build in (lambda: add_segments(database, str(root), 'video'),
                  lambda: folder_json.main([str(root), str(tmp_path / 'b.json')])):
        with pytest.raises(SystemExit, match='clip.MP4 and clip.avi.*rename or remove one'):
            build()
    assert 'segment' not in database['clip']['annotations'] and not (tmp_path / 'b.json').exists()
    (root / 'cls' / 'clip.avi').unlink()
    assert video_files(root / 'cls') == {'clip': 'clip.MP4', 'other': 'other.mp4'}



def test_a_name_in_two_classes_keeps_its_upper_case_extension_in_folder_json(tmp_path):
    """The entry of a name found in two classes points at its file: one of IMG_0001.MP4
    stopped folder_json with an AssertionError ("measured but not found"), its path
    looked for in lower case only."""
    from tests.video_files import write_video
    from util_scripts import folder_json
    for name in ('a/IMG_0001.MP4', 'b/IMG_0001.mp4'):
        write_video(tmp_path / 'v' / name, n_frames=5)
    folder_json.main([str(tmp_path / 'v'), str(tmp_path / 'a.json'), '--val_fraction', '0'])
    database = json.loads((tmp_path / 'a.json').read_text())['database']
    assert {k: v['video_path'] for k, v in database.items()} == {
        'a/IMG_0001': 'a/IMG_0001.MP4', 'b/IMG_0001': 'b/IMG_0001.mp4'}


# ----------------------------------------------------------------------------- loaders

def test_jpg_loader_pixels_repeats_and_single_decode(tmp_path, monkeypatch):
    video = write_jpg_video(tmp_path / 'vid', 8)
    loader = JpgClipLoader()
    clip = loader(str(video), [0, 3, 7])
    assert clip.dtype == torch.uint8 and clip.shape == (3, 3, SIZE, SIZE)
    for k, p in enumerate([0, 3, 7]):
        assert_solid(clip[k], colour(p))

    calls = []
    real = loader_module.simplejpeg.decode_jpeg

    def spy(data, **kw):
        calls.append(len(data))
        return real(data, **kw)
    monkeypatch.setattr(loader_module.simplejpeg, 'decode_jpeg', spy)
    clip = loader(video, [5, 2, 5, 5, 2])
    assert len(calls) == 2  # two distinct frames, each decoded once
    assert clip.shape[0] == 5
    assert torch.equal(clip[0], clip[2]) and torch.equal(clip[1], clip[4])
    assert_solid(clip[1], colour(2))


def test_jpg_loader_missing_and_corrupt_frames(tmp_path):
    video = write_jpg_video(tmp_path / 'vid', 8)
    loader = JpgClipLoader()
    msg = _raises_naming(lambda: loader(video, range(0, 9)), 'image_00009.jpg', video)
    assert 're-extract' in msg
    (video / 'image_00004.jpg').write_bytes(b'this is not a jpeg at all' * 10)
    _raises_naming(lambda: loader(video, range(0, 8)), 'image_00004.jpg', 'corrupt')
    (video / 'image_00005.jpg').write_bytes(b'')
    _raises_naming(lambda: loader(video, [4]), 'image_00005.jpg')
    _raises_naming(lambda: loader(tmp_path / 'no_such_video', [0]), 'no_such_video')


def test_hdf5_loader_matches_jpg_and_loads_last_frame(tmp_path):
    video = write_jpg_video(tmp_path / 'vid', 8)
    h5 = write_hdf5_video(tmp_path / 'vid.hdf5', 8)
    jl, hl = JpgClipLoader(), Hdf5ClipLoader(max_open=1)
    for positions in ([0, 1, 2, 3], [0, 2, 7], [7, 7, 1], [7]):
        assert torch.equal(jl(video, positions), hl(h5, positions))
    assert_solid(hl(h5, [7])[0], colour(7))  # last frame of a 0-based 8-frame video
    _raises_naming(lambda: hl(h5, [8]), 'vid.hdf5', '8 frames')
    _raises_naming(lambda: hl(tmp_path / 'missing.hdf5', [0]), 'missing.hdf5')
    # LRU bound, and pickling drops open handles (fork/spawn safe)
    other = write_hdf5_video(tmp_path / 'other.hdf5', 4)
    hl(other, [0])
    assert len(hl._files) == 1
    clone = pickle.loads(pickle.dumps(hl))
    assert len(clone._files) == 0
    assert torch.equal(clone(h5, [3]), hl(h5, [3]))


class _Handle:
    def __init__(self, path):
        self.path, self.closed = path, False

    def close(self):
        self.closed = True


def _child_of(cache, inherited):
    """In a forked child: the parent's handles are set aside, never closed."""
    fresh = cache.get('a', _Handle)
    cache.close()
    os._exit(0 if fresh is not inherited and fresh.closed and not inherited.closed else 1)


def test_open_files_one_cache_per_process():
    """datasets/open_files.py, the hdf5 and video loaders' one cache of open files."""
    import multiprocessing

    from datasets.open_files import OpenFiles
    cache = OpenFiles(max_open=2)
    a, b = cache.get('a', _Handle), cache.get('b', _Handle)
    assert cache.get('a', _Handle) is a and cache.local(list) is cache.local(list)
    c = cache.get('c', _Handle)  # over max_open: the least recently used (b) is closed
    assert (a.closed, b.closed, c.closed, len(cache)) == (False, True, False, 2)
    assert len(pickle.loads(pickle.dumps(cache))) == 0
    child = multiprocessing.get_context('fork').Process(target=_child_of, args=(cache, a))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    cache.discard('a')
    assert a.closed and len(cache) == 1


def test_hdf5_flow_loader(tmp_path):
    h5 = write_hdf5_video(tmp_path / 'flow.hdf5', 6, flow=True)
    clip = Hdf5FlowLoader()(h5, [0, 5, 5])
    assert clip.shape == (3, 2, SIZE, SIZE) and clip.dtype == torch.uint8
    assert abs(clip[1].float().mean().item() - 80) < 3
    assert isinstance(make_loader('hdf5', 'flow'), Hdf5FlowLoader)
    assert isinstance(make_loader('jpg', 'rgb'), JpgClipLoader)
    assert isinstance(make_loader('hdf5', 'rgb'), Hdf5ClipLoader)
    with pytest.raises(DataError):
        make_loader('jpg', 'flow')


# ----------------------------------------------------------------------------- data sets

def _records(tmp_path, lengths, label=0):
    recs = []
    for i, n in enumerate(lengths):
        folder = write_jpg_video(tmp_path / 'v' / 'walk' / f'vid{i}', n)
        recs.append(VideoRecord(f'vid{i}', str(folder), 0, n, label, (1, n + 1)))
    return recs


class CountingLoader(JpgClipLoader):
    """Counts the reads (a data set reads through ``read``, then decodes)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def read(self, video_dir, positions):
        self.calls.append(list(positions))
        return super().read(video_dir, positions)


def test_clip_dataset_single_and_multi_clip(tmp_path):
    recs = _records(tmp_path, [8, 12])
    loader = CountingLoader()
    train = VideoClipDataset(recs, loader, TemporalRandomCrop(4, 2),
                             build_train_transform(16, min_scale=0.5))
    clip, label = train[1]
    assert clip.shape == (3, 4, 16, 16) and clip.dtype == torch.float32 and label == 0
    assert len(loader.calls) == 1

    ev = build_eval_transform(16)
    val = VideoClipDataset(recs, loader, TemporalEvenCrop(4, 3), ev)
    loader.calls.clear()
    clips, label = val[1]
    assert clips.shape == (3, 3, 4, 16, 16) and clips.is_contiguous()
    assert len(loader.calls) == 1 and loader.calls[0] == list(range(12))  # union, decoded once
    # same result as transforming every clip on its own
    for k, positions in enumerate(TemporalEvenCrop(4, 3)(range(12))):
        expected = ev(JpgClipLoader()(recs[1].path, positions))
        assert torch.allclose(clips[k], expected, atol=1e-5)
    # short video, 3 overlapping loop-padded clips
    clips, _ = VideoClipDataset(_records(tmp_path / 's', [2]), JpgClipLoader(),
                                TemporalEvenCrop(4, 3), ev)[0]
    assert clips.shape == (3, 3, 4, 16, 16)
    batch = torch.utils.data.default_collate([val[0], val[1]])
    assert batch[0].shape == (2, 3, 3, 4, 16, 16)


def test_dataset_error_names_video(tmp_path):
    rec = VideoRecord('lost_video', str(tmp_path / 'walk' / 'lost_video'), 0, 8, 0, (1, 9))
    ds = VideoClipDataset([rec], JpgClipLoader(), TemporalRandomCrop(4),
                          build_eval_transform(16))
    _raises_naming(lambda: ds[0], 'lost_video')


def test_window_dataset_covers_videos_contiguously(tmp_path):
    recs = _records(tmp_path, [8, 20, 3])
    # hdf5-style 0-based record for the numbering check
    h5 = write_hdf5_video(tmp_path / 'z.hdf5', 6)
    sw = SlidingWindow(4, 4)
    ds = VideoWindowDataset(recs, JpgClipLoader(), sw, build_eval_transform(16))
    assert ds.video_of_item.tolist() == [0, 0, 1, 1, 1, 1, 1, 2]
    assert len(ds) == 8
    for v, r in enumerate(recs):
        items = range(int(ds.video_offsets[v]), int(ds.video_offsets[v + 1]))
        assert list(items) == [i for i in range(len(ds)) if ds.video_of_item[i] == v]
        covered = set()
        for i in items:
            clip, vi, (b, e) = ds[i]
            assert vi == v and clip.shape == (3, 4, 16, 16)
            covered.update(range(b, e))
        assert covered == set(range(1, r.n_frames + 1))  # 1-based numbers, every frame
    assert ds[0][2] == (1, 5) and ds[1][2] == (5, 9) and ds[6][2] == (17, 21)
    ds0 = VideoWindowDataset([VideoRecord('z', str(h5), 0, 6, -1, (0, 6))], Hdf5ClipLoader(),
                             sw, build_eval_transform(16))
    assert [ds0[i][2] for i in range(len(ds0))] == [(0, 4), (4, 6)]
    # shards: contiguous, whole videos, cover everything
    for world in (1, 2, 3, 5):
        shards = [ds.shard(r, world) for r in range(world)]
        assert [i for s in shards for i in s] == list(range(len(ds)))
        for s in shards:
            if len(s):
                assert s.start == 0 or ds.video_of_item[s.start] != ds.video_of_item[s.start - 1]
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=3)))
    assert batch[0].shape == (3, 3, 4, 16, 16) and batch[1].tolist() == [0, 0, 1]


def test_hdf5_dataset_in_worker_processes(tmp_path):
    paths = [write_hdf5_video(tmp_path / f'v{i}.hdf5', 8) for i in range(3)]
    recs = [VideoRecord(f'v{i}', str(p), 0, 8, i, (0, 8)) for i, p in enumerate(paths)]
    loader = Hdf5ClipLoader()
    ds = VideoClipDataset(recs, loader, TemporalRandomCrop(4), build_eval_transform(16))
    ds[0]  # parent opens a file before the workers start
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        dl = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=1)
        clips, labels = next(iter(dl))
    assert clips.shape == (3, 3, 4, 16, 16) and labels.tolist() == [0, 1, 2]


# ----------------------------------------------------------------------------- JPEG decoder

def pillow_jpeg(height, width, gray=False, seed=0, **options):
    """A textured frame (gradients, stripes, noise) as Pillow JPEG bytes."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([(3 * x + y) % 256, (5 * y) % 256, (x * y) % 256], -1)
    img = np.clip(img + rng.integers(-20, 20, img.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img[..., 0] if gray else img, 'L' if gray else 'RGB').save(buf, 'JPEG',
                                                                              **options)
    return buf.getvalue()


JPEG_OPTIONS = [dict(quality=95), dict(quality=75, subsampling=0), dict(quality=90, subsampling=1),
                dict(quality=85, progressive=True)]


@pytest.mark.parametrize('height, width', [(240, 320), (241, 321), (17, 33), (360, 480)])
def test_frames_identical_to_torchvision_decode_jpeg(tmp_path, height, width):
    """simplejpeg (the data path) against torchvision.io.decode_jpeg (the path
    before it): every pixel equal, RGB and grayscale JPEGs, 4:2:0 / 4:4:4 /
    4:2:2 / progressive, through the jpg, hdf5 and flow loaders."""
    from torchvision.io import ImageReadMode, decode_jpeg
    frames = {gray: [pillow_jpeg(height, width, gray, seed=i, **o) for i, o in
                     enumerate(JPEG_OPTIONS)] for gray in (False, True)}

    def reference(data, mode):
        return torch.stack([decode_jpeg(torch.frombuffer(bytearray(d), dtype=torch.uint8),
                                        mode=mode) for d in data])
    n = len(JPEG_OPTIONS)
    for gray, data in frames.items():
        folder = tmp_path / f'jpg_{gray}'
        folder.mkdir()
        for p, d in enumerate(data):
            (folder / f'image_{p + 1:05d}.jpg').write_bytes(d)
        rgb = reference(data, ImageReadMode.RGB)
        assert torch.equal(JpgClipLoader()(folder, range(n)), rgb)
        assert torch.equal(JpgClipLoader('GRAY')(folder, range(n)),
                           reference(data, ImageReadMode.GRAY))
    h5 = tmp_path / 'v.hdf5'
    with h5py.File(h5, 'w') as f:
        for key, data in (('video', frames[False]), ('video_u', frames[True]),
                          ('video_v', frames[False])):
            ds = f.create_dataset(key, (n,), dtype=h5py.vlen_dtype(np.uint8))
            for p, d in enumerate(data):
                ds[p] = np.frombuffer(d, dtype=np.uint8)
    assert torch.equal(Hdf5ClipLoader()(h5, range(n)), reference(frames[False], ImageReadMode.RGB))
    flow = Hdf5FlowLoader()(h5, [3, 0, 3])
    expected = torch.cat([reference(frames[True], ImageReadMode.GRAY),
                          reference(frames[False], ImageReadMode.GRAY)], dim=1)[[3, 0, 3]]
    assert flow.shape == (3, 2, height, width) and torch.equal(flow, expected)


def test_corrupt_truncated_empty_and_odd_sized_frames_name_the_file(tmp_path):
    video = write_jpg_video(tmp_path / 'vid', 4)
    good = (video / 'image_00002.jpg').read_bytes()
    (video / 'image_00002.jpg').write_bytes(good[:len(good) // 2])  # truncated
    _raises_naming(lambda: JpgClipLoader()(video, range(4)), 'image_00002.jpg', 'corrupt',
                   're-extract')
    (video / 'image_00002.jpg').write_bytes(good)
    (video / 'image_00003.jpg').write_bytes(jpeg_frames(1, size=SIZE + 8)[0])  # larger
    _raises_naming(lambda: JpgClipLoader()(video, range(4)), 'image_00003.jpg',
                   'different sizes', f'{SIZE + 8}x{SIZE + 8}')
    (video / 'image_00003.jpg').write_bytes(jpeg_frames(1, size=SIZE - 8)[0])  # smaller
    _raises_naming(lambda: JpgClipLoader()(video, range(4)), 'image_00003.jpg',
                   'different sizes')
    # the first frame's header is read before anything is decoded
    (video / 'image_00001.jpg').write_bytes(b'\xff\xd8 not a jpeg header' * 4)
    _raises_naming(lambda: JpgClipLoader().read(video, range(4)).frame_size, 'image_00001.jpg',
                   'corrupt')
    h5 = write_hdf5_video(tmp_path / 'v.hdf5', 3)
    with h5py.File(h5, 'a') as f:
        f['video'][1] = np.zeros(0, dtype=np.uint8)  # an empty element
    _raises_naming(lambda: Hdf5ClipLoader()(h5, range(3)), 'v.hdf5[video][1]', 'corrupt')


def parsed(tiny, tmp_path, *extra):
    return parse_opts(tiny_args(*tiny, tmp_path / 'r', *extra))


def prepared(tiny, tmp_path, *extra):
    """(options, run record) of a one-process CPU run."""
    opt = parsed(tiny, tmp_path, *extra)
    record, _ = main.prepare(opt, DistContext())
    return opt, record


def test_sample_t_stride_applies_to_train_val_and_inference(tiny_synthetic, tmp_path):
    opt, record = prepared(tiny_synthetic, tmp_path, '--sample_t_stride', '2',
                           '--sample_duration', '4', '--train_t_crop', 'center')
    train_set, _ = dataset.get_training_data(opt, record)
    val_set, _ = dataset.get_validation_data(opt, record)
    infer_set, _ = dataset.get_inference_data(opt, record)
    assert list(train_set.temporal_transform(0, 12)) == [2, 4, 6, 8]  # centre 7 frames, every 2nd
    for clip in val_set.temporal_transform(0, 12):
        assert [b - a for a, b in zip(clip, clip[1:])] == [2, 2, 2]
    for window in infer_set.sliding_window(0, 12):
        assert [b - a for a, b in zip(window, window[1:])] == [2, 2, 2]
    x, _, (begin, end) = infer_set[0]
    assert x.shape[1] == 4 and (begin, end) == (1, 8)  # 1-based frames 1..7


def test_ranks_augment_differently_and_repeatably(tiny_synthetic, tmp_path):
    opt, record = prepared(tiny_synthetic, tmp_path, '--train_crop', 'random', '--colorjitter')
    train_set, _ = dataset.get_training_data(opt, record)

    def first_clip(rank, epoch):
        dataset.seed_worker_rngs(epoch_seed(opt.manual_seed, rank, epoch))
        return train_set[0][0]

    assert not torch.equal(first_clip(0, 1), first_clip(1, 1))  # ranks differ
    assert not torch.equal(first_clip(0, 1), first_clip(0, 2))  # epochs differ
    assert torch.equal(first_clip(1, 3), first_clip(1, 3))      # and are reproducible


def test_seeds_keep_their_values():
    """Every seed is mixed in utils/resumable_data.py; the values are those the
    runs before it drew (a checkpoint written then resumes as it did)."""
    assert sample_seed(7, 3, 11) == 7000255000803
    assert epoch_seed(7, 1, 3) == 7010031
    assert restart_seed(12345, 4) == 12345407389
    assert sample_seed(2**62, 1, -1) == 4611686018428387936  # wraps at 2**63


@pytest.mark.slow
def test_validation_subset_with_fewer_than_five_videos(tiny_synthetic, tmp_path):
    """The predecessor divided by zero on subsets of fewer than 5 videos."""
    video_path, annotation_path = tiny_synthetic
    ann = json.loads(annotation_path.read_text())
    val_ids = [k for k, v in ann['database'].items() if v['subset'] == 'validation']
    for vid in val_ids[2:]:
        del ann['database'][vid]
    small = tmp_path / 'small.json'
    small.write_text(json.dumps(ann))
    main.main(tiny_args(video_path, small, tmp_path / 'r', '--n_epochs', '1',
                        '--n_val_samples', '1', '--inference'))
    assert len(json.loads((tmp_path / 'r' / 'val.json').read_text())['results']) == 2


def test_linear_lr_scaling(tiny_synthetic, tmp_path):
    opt = parsed(tiny_synthetic, tmp_path, '--lr_scaling', 'linear', '--base_batch_size', '4',
                 '--accumulation_steps', '2', '--learning_rate', '0.01')
    record, _ = main.prepare(opt, DistContext(rank=0, world_size=2))
    # global batch 8 x 2 accumulation steps over a base batch of 4
    assert record.learning_rate == pytest.approx(0.04)
    assert opt.learning_rate == 0.01  # the options stay as given
    assert record.batch_per_process == 4
    opt = parsed(tiny_synthetic, tmp_path, '--batch_size', '7')
    with pytest.raises(Exception, match='divisible'):
        main.prepare(opt, DistContext(rank=0, world_size=2))


@pytest.mark.slow
def test_amp_is_ignored_on_cpu(tiny_synthetic, tmp_path, capsys):
    main.main(tiny_args(*tiny_synthetic, tmp_path / 'r', '--n_epochs', '1', '--amp', '--no_val'))
    assert '--amp is ignored on CPU' in capsys.readouterr().out
    ckpt = torch.load(tmp_path / 'r' / 'save_1.pth', weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt['state_dict'].values()
               if v.is_floating_point())


def test_one_parameter_group_without_frozen_tensors():
    from training import OptimizerConfig, make_optimizer
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    net[0].requires_grad_(False)
    optimizer = make_optimizer(net, OptimizerConfig('sgd', 0.1, weight_decay=0.0))
    assert len(optimizer.param_groups) == 1
    assert len(optimizer.param_groups[0]['params']) == 2


@pytest.mark.slow
def test_channels_last_gives_the_same_training(tiny_synthetic, tmp_path):
    for name, extra in (('plain', ()), ('cl', ('--channels_last',))):
        main.main(tiny_args(*tiny_synthetic, tmp_path / name, '--n_epochs', '1', '--no_val',
                            '--inference', *extra))
    a = torch.load(tmp_path / 'plain' / 'save_1.pth', weights_only=True)['state_dict']
    b = torch.load(tmp_path / 'cl' / 'save_1.pth', weights_only=True)['state_dict']
    # oneDNN picks other convolution kernels for channels_last; with one thread
    # (OMP_NUM_THREADS=1) their rounding differs by up to 7e-4 after 3 steps.
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=2e-3), k
    ra = json.loads((tmp_path / 'plain' / 'val.json').read_text())['results']
    rb = json.loads((tmp_path / 'cl' / 'val.json').read_text())['results']
    assert [e['label'] for v in ra.values() for e in v[:1]] == \
        [e['label'] for v in rb.values() for e in v[:1]]


def test_normalizing_on_the_device_gives_the_same_clips(tiny_synthetic, tmp_path):
    outputs = {}
    for mode in ('off', 'on'):
        opt, record = prepared(tiny_synthetic, tmp_path, '--normalize_on_device', mode,
                               '--train_crop', 'random', '--colorjitter')
        train_set, _ = dataset.get_training_data(opt, record)
        val_set, _ = dataset.get_validation_data(opt, record)
        infer_set, _ = dataset.get_inference_data(opt, record)
        items = []
        for ds in (train_set, val_set, infer_set):
            dataset.seed_worker_rngs(5)
            x = ds[1][0]
            normalizer = ds.spatial_transform.device_normalizer
            if normalizer is not None:
                assert x.dtype == torch.uint8
                x = normalizer(x.flatten(0, -5) if x.dim() == 5 else x[None])
                x = x if ds is val_set else x[0]
            items.append(x)
        outputs[mode] = items
    for a, b in zip(outputs['off'], outputs['on']):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_training_with_normalization_on_the_device(tiny_synthetic, tmp_path):
    for mode in ('off', 'on'):
        main.main(tiny_args(*tiny_synthetic, tmp_path / mode, '--n_epochs', '1',
                            '--normalize_on_device', mode, '--inference'))
    a = torch.load(tmp_path / 'off' / 'save_1.pth', weights_only=True)['state_dict']
    b = torch.load(tmp_path / 'on' / 'save_1.pth', weights_only=True)['state_dict']
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=1e-5), k
    va = read_tsv(tmp_path / 'off' / 'val.log')[0]
    vb = read_tsv(tmp_path / 'on' / 'val.log')[0]
    assert float(va['loss']) == pytest.approx(float(vb['loss']), rel=1e-4)


def test_seeded_samples_seed_the_cpu_generator_alone(tiny_synthetic, tmp_path, monkeypatch):
    """A sample loaded in the main process (--n_threads 0) must not reseed the
    CUDA generators: fork_rng(devices=[]) restores the CPU one only, so a
    torch.manual_seed there would leave every GPU's stream at the sample's seed.
    The clip is the one drawn from the sample's seed on the CPU generator."""
    import random

    from utils.resumable_data import SeededSamples
    opt, record = prepared(tiny_synthetic, tmp_path, '--colorjitter')
    train_set, _ = dataset.get_training_data(opt, record)
    seeded = SeededSamples(train_set, 7)
    seeded.epoch = 2
    cuda_seeds = []
    monkeypatch.setattr(torch.cuda, 'manual_seed_all', cuda_seeds.append)
    monkeypatch.setattr(torch.cuda, 'manual_seed', cuda_seeds.append)
    torch.manual_seed(1)
    cuda_seeds.clear()
    before = torch.get_rng_state()
    clip, label = seeded[3]
    assert cuda_seeds == []
    assert torch.equal(torch.get_rng_state(), before)
    seed = sample_seed(7, 2, 3)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)
    expected, expected_label = train_set[3]
    assert label == expected_label and torch.equal(clip, expected)
