"""The built-in synthetic motion data set."""
import json

import numpy as np
import pytest
import torch

from datasets.annotation import load_annotations
from datasets.frame_check import check_videos
from datasets.loader import JpgClipLoader
from datasets.spatial_transforms import build_train_transform
from datasets.synthetic import (
    ANNOTATION_NAME,
    CLASSES,
    STAMP_NAME,
    prepare_synthetic,
    render_video,
    video_seed,
)
from datasets.temporal_transforms import TemporalRandomCrop
from datasets.videodataset import VideoClipDataset

SMALL = dict(n_train_per_class=2, n_val_per_class=1, n_test=2, n_frames=8, frame_size=32)


@pytest.fixture(scope='module')
def small_set(tmp_path_factory):
    root = tmp_path_factory.mktemp('syn')
    return root, prepare_synthetic(root, seed=3, **SMALL)


def test_layout_and_annotation_load_with_real_readers(small_set):
    root, (video_path, annotation_path) = small_set
    assert video_path == str(root / 'jpg') and annotation_path == str(root / ANNOTATION_NAME)
    data = json.loads((root / ANNOTATION_NAME).read_text())
    assert data['labels'] == list(CLASSES)
    train, names = load_annotations(annotation_path, 'training', video_path, 'synthetic')
    val, _ = load_annotations(annotation_path, 'validation', video_path, 'synthetic')
    test, _ = load_annotations(annotation_path, 'testing', video_path, 'synthetic')
    assert names == list(CLASSES)
    assert len(train) == 2 * len(CLASSES) and len(val) == len(CLASSES) and len(test) == 2
    assert sorted(r.label for r in train) == sorted(list(range(len(CLASSES))) * 2)
    assert all(r.segment == (1, 9) and r.first_frame == 0 and r.n_frames == 8 for r in train)
    assert all(r.label == -1 and '/test/' in r.path for r in test)
    for records in (train, val, test):
        check_videos(records, 'jpg')
    ds = VideoClipDataset(train, JpgClipLoader(), TemporalRandomCrop(8),
                          build_train_transform(32, hflip=False, min_scale=0.5))
    clip, label = ds[0]
    assert clip.shape == (3, 8, 32, 32) and 0 <= label < len(CLASSES)


def test_deterministic_from_seed(small_set, tmp_path):
    root, _ = small_set
    again = tmp_path / 'again'
    prepare_synthetic(again, seed=3, **SMALL)
    assert (root / ANNOTATION_NAME).read_bytes() == (again / ANNOTATION_NAME).read_bytes()
    vid = 'jpg/grow/train_grow_001'
    for i in range(1, 9):
        name = f'{vid}/image_{i:05d}.jpg'
        assert (root / name).read_bytes() == (again / name).read_bytes()
    other = tmp_path / 'other'
    prepare_synthetic(other, seed=4, **SMALL)
    assert (root / vid / 'image_00001.jpg').read_bytes() != \
        (other / vid / 'image_00001.jpg').read_bytes()


def test_idempotent_and_regenerates_when_incomplete_or_changed(small_set, tmp_path):
    root, paths = small_set
    # nothing rewritten (not timed: a loaded machine makes any call slow)
    files = [root / STAMP_NAME, *sorted(root.rglob('*.jpg'))[:3], *sorted(root.glob('*.json'))]
    before = [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]
    assert prepare_synthetic(root, seed=3, **SMALL) == paths
    assert [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files] == before

    fresh = tmp_path / 'fresh'
    prepare_synthetic(fresh, seed=0, **SMALL)
    # an interrupted generation (no stamp, leftover temp dir) is redone
    (fresh / STAMP_NAME).unlink()
    (fresh / 'jpg' / 'grow' / 'train_grow_000' / 'image_00003.jpg').unlink()
    (fresh / '.tmp-synthetic-leftover').mkdir()
    prepare_synthetic(fresh, seed=0, **SMALL)
    assert (fresh / 'jpg' / 'grow' / 'train_grow_000' / 'image_00003.jpg').is_file()
    assert not list(fresh.glob('.tmp-synthetic-*'))
    # other parameters: regenerated with them
    prepare_synthetic(fresh, seed=0, **{**SMALL, 'n_frames': 6})
    records, _ = load_annotations(fresh / ANNOTATION_NAME, 'training', fresh / 'jpg', 'synthetic')
    assert all(r.n_frames == 6 for r in records)
    check_videos(records, 'jpg')
    assert not (fresh / 'jpg' / 'grow' / 'train_grow_000' / 'image_00007.jpg').exists()


def test_written_frames_are_the_rendered_ones_and_move(small_set):
    root, (video_path, _) = small_set
    c = CLASSES.index('move_right')
    i = 1
    frames, _ = render_video(video_seed(3, 'training', c * SMALL['n_train_per_class'] + i), c,
                             SMALL['n_frames'], SMALL['frame_size'])
    clip = JpgClipLoader()(f'{video_path}/move_right/train_move_right_{i:03d}', range(8))
    rendered = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    pool = torch.nn.functional.avg_pool2d  # compare 4x4 means: JPEG noise averages out
    assert (pool(clip.float(), 4) - pool(rendered, 4)).abs().mean() < 3
    other, _ = render_video(video_seed(3, 'training', 0), c, SMALL['n_frames'],
                            SMALL['frame_size'])
    other = torch.from_numpy(other).permute(0, 3, 1, 2).float()
    assert (pool(clip.float(), 4) - pool(other, 4)).abs().mean() > 15
    for t in range(7):  # consecutive frames differ
        assert (clip[t + 1].float() - clip[t].float()).abs().mean() > 0.5


def _centroids(mask):
    t, h, w = mask.shape
    yy, xx = np.mgrid[0:h, 0:w]
    area = mask.sum(axis=(1, 2))
    return ((mask * yy).sum(axis=(1, 2)) / area, (mask * xx).sum(axis=(1, 2)) / area, area)


@pytest.mark.parametrize('name', CLASSES)
def test_motion_matches_label(name):
    c = CLASSES.index(name)
    for seed in range(10):
        frames, mask = render_video(np.random.default_rng(seed), c, 16, 40)
        assert frames.shape == (16, 40, 40, 3) and frames.dtype == np.uint8
        assert mask.any(axis=(1, 2)).all()  # object always visible
        cy, cx, area = _centroids(mask)
        dy, dx = cy[-1] - cy[0], cx[-1] - cx[0]
        if name == 'move_left':
            assert dx < -8 and abs(dy) < 1
        elif name == 'move_right':
            assert dx > 8 and abs(dy) < 1
        elif name == 'move_up':
            assert dy < -8 and abs(dx) < 1
        elif name == 'move_down':
            assert dy > 8 and abs(dx) < 1
        elif name == 'grow':
            assert area[-1] > 1.5 * area[0] and np.all(np.diff(area) >= 0)
        else:
            assert area[-1] < area[0] / 1.5 and np.all(np.diff(area) <= 0)
        # the object stands out from the background in every frame
        inside = frames[mask].astype(float).mean(axis=0)
        outside = frames[~mask].astype(float).mean(axis=0)
        assert np.abs(inside - outside).mean() > 25


def test_single_frame_does_not_give_the_class_away():
    """Position, colour and shape vary within a class; grow and shrink share sizes."""
    grow, shrink = CLASSES.index('grow'), CLASSES.index('shrink')
    sizes = {grow: [], shrink: []}
    for seed in range(30):
        for c in (grow, shrink):
            _, mask = render_video(np.random.default_rng(seed), c, 16, 40)
            sizes[c].append(mask[len(mask) // 2].sum())
    lo = max(min(sizes[grow]), min(sizes[shrink]))
    hi = min(max(sizes[grow]), max(sizes[shrink]))
    assert hi > lo  # middle-frame object sizes overlap
    # where the object is in a frame does not tell left from right
    xs = {}
    for name in ('move_left', 'move_right'):
        xs[name] = np.concatenate([
            _centroids(render_video(np.random.default_rng(s), CLASSES.index(name), 16, 40)[1])[1]
            for s in range(20)])
        assert xs[name].std() > 5
    assert abs(xs['move_left'].mean() - xs['move_right'].mean()) < 3
    ys = [_centroids(render_video(np.random.default_rng(s), 0, 16, 40)[1])[0][0]
          for s in range(20)]
    assert np.std(ys) > 4  # random position across the motion
