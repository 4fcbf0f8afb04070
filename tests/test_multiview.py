"""Multi-view testing pieces: evenly spread clips one item at a time, three
crops along the long side, and the data set that serves them."""
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from datasets.annotation import VideoRecord
from datasets.device_batches import DeviceLoader, ToDevice
from datasets.spatial_transforms import ThreeCropTransform, build_eval_transform, three_crop_boxes
from datasets.temporal_transforms import TemporalEvenCrop
from datasets.videodataset import VideoWindowDataset

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def test_even_crop_windows_are_its_clips():
    even = TemporalEvenCrop(4, n_samples=3, t_stride=2)  # span 7
    frames = range(10, 40)  # 30 frames: room 23 -> starts 0, 11, 23
    assert even.starts(30) == [0, 11, 23]
    assert even.n_windows(30) == 3
    assert [even.window(frames, k) for k in range(3)] == even(frames)
    assert even.window(frames, 1) == [21, 23, 25, 27]
    # shorter than the span: every clip starts at 0, loop-padded
    assert [even.window(range(3), k) for k in range(3)] == [[0, 2, 0, 2]] * 3


@pytest.mark.parametrize('height, width, expected', [
    (32, 48, [(0, 0, 32, 32), (0, 8, 32, 32), (0, 16, 32, 32)]),   # wide: left/center/right
    (45, 32, [(0, 0, 32, 32), (6, 0, 32, 32), (13, 0, 32, 32)]),   # tall: top/center/bottom
    (32, 32, [(0, 0, 32, 32)] * 3),                                 # square: the center 3x
])
def test_three_crop_boxes(height, width, expected):
    assert three_crop_boxes(height, width, 32) == expected


def test_three_crop_boxes_too_small():
    with pytest.raises(ValueError, match='smaller than the 32x32 crop'):
        three_crop_boxes(20, 40, 32)


def test_three_crop_transform_pixels():
    # already 32 high: the resize keeps it as it is
    clip = torch.arange(32 * 48 * 3 * 2, dtype=torch.int64).remainder(251).to(torch.uint8)
    small = clip = clip.view(2, 3, 32, 48)
    t = build_eval_transform(32, mean=[0, 0, 0], std=[1 / 255] * 3, crop='three')
    assert isinstance(t, ThreeCropTransform)
    views = t.augment(clip)
    assert views.shape == (3, 2, 3, 32, 32)
    for view, left in zip(views, (0, 8, 16)):
        torch.testing.assert_close(view, small[..., left:left + 32])
    out = t(clip)  # normalized, (K, C, T, H, W); identity statistics at scale 255
    assert out.shape == (3, 3, 2, 32, 32) and out.dtype == torch.float32
    torch.testing.assert_close(out[2], small[..., 16:48].float().movedim(1, 0))
    # the middle view is what crop='center' gives
    center = build_eval_transform(32, mean=[0, 0, 0], std=[1 / 255] * 3)
    torch.testing.assert_close(out[1], center(clip))


class PositionLoader:
    """A fake video whose frame p is filled with p (and a horizontal ramp, so
    that crops differ): (T, 3, 32, 48) uint8."""

    def __call__(self, path, positions):
        ramp = torch.arange(48, dtype=torch.uint8).view(1, 1, 1, 48)
        p = torch.tensor(positions, dtype=torch.uint8).view(-1, 1, 1, 1)
        return (p * 4 + ramp).expand(-1, 3, 32, 48).contiguous()


def test_window_dataset_with_clips_and_crops():
    records = [VideoRecord('a', 'a', 0, 20, 0, (1, 21)), VideoRecord('b', 'b', 0, 5, 1, (1, 6))]
    even = TemporalEvenCrop(4, n_samples=3)
    spatial = build_eval_transform(32, mean=[0, 0, 0], std=[1 / 255] * 3,
                                   crop='three')
    ds = VideoWindowDataset(records, PositionLoader(), even, spatial)
    assert len(ds) == 6 and ds.n_windows.tolist() == [3, 3]
    clip_a1, v, segment = clip, v, segment = ds[1]  # video a, clip 1 of 3: start 8
    assert v == 0 and segment == (9, 13)
    assert clip.shape == (3, 3, 4, 32, 32)  # (crops, C, T, H, W)
    first_frame = clip[:, 0, :, 0, 0]  # (crop, T): position * 4 + left edge
    expected = torch.tensor([[p * 4 + left for p in range(8, 12)] for left in (0, 8, 16)])
    torch.testing.assert_close(first_frame, expected.float())
    clip, v, segment = ds[4]  # video b (5 frames, room 1): starts 0, 0, 1
    assert v == 1 and segment == (1, 5)
    np.testing.assert_array_equal(clip[0, 0, :, 0, 0].numpy(), [0, 4, 8, 12])
    # deferred normalization: uint8 (K, T, C, H, W), normalized after the copy
    normalizer = spatial.defer_normalization()
    raw, _, _ = ds[1]
    assert raw.dtype == torch.uint8 and raw.shape == (3, 4, 3, 32, 32)
    torch.testing.assert_close(normalizer(raw), clip_a1)


def _tiny_model(n_classes=4):
    from models import resnet
    torch.manual_seed(0)
    return resnet.generate_model(10, widen_factor=0.25, n_classes=n_classes).eval()


@pytest.mark.slow
def test_view_scores_are_the_mean_over_views_by_hand():
    from inference import ViewScores, score_views
    records = [VideoRecord('a', 'a', 0, 20, 0, (1, 21)), VideoRecord('b', 'b', 0, 9, 1, (1, 10))]
    even = TemporalEvenCrop(4, n_samples=2)
    mean, std = [0.5] * 3, [0.25] * 3
    spatial = build_eval_transform(32, mean=mean, std=std, crop='three')
    ds = VideoWindowDataset(records, PositionLoader(), even, spatial)
    model = _tiny_model()
    scores = ViewScores(keep_views=True)
    # batches of 3 items cross the boundary between the two videos
    loader = DeviceLoader(DataLoader(ds, batch_size=3), ToDevice(torch.device('cpu')))
    for batch in score_views(loader, model, feature_module=model.fc):
        scores.add(*batch)
    for v, record in enumerate(records):
        views, logits = [], []
        for k in range(2):
            frames = PositionLoader()(record.path, even.window(record.positions, k))
            for top, left, h, w in three_crop_boxes(32, 48, 32):
                crop = frames[..., top:top + h, left:left + w].float() / 255
                x = ((crop - 0.5) / 0.25).movedim(1, 0)[None]  # (1, C, T, H, W)
                with torch.no_grad():
                    logits.append(model(x)[0])
                views.append(logits[-1].softmax(0))
        assert scores.counts[v] == 6
        # the classifier is linear: applied to the mean feature it gives the mean logits
        with torch.no_grad():
            torch.testing.assert_close(model.fc(scores.mean_features(v)),
                                       torch.stack(logits).mean(0), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(scores.mean(v), torch.stack(views).mean(0), rtol=1e-5,
                                   atol=1e-6)
        kept = torch.stack([p for _, _, p in scores.views[v]])
        torch.testing.assert_close(kept, torch.stack(views), rtol=1e-5, atol=1e-6)
        assert [crop for _, crop, _ in scores.views[v]] == [0, 1, 2] * 2


def _infer_worker(ctx, out_path):
    """run_inference of 3 videos x 2 clips x 3 crops on ctx's ranks."""
    from dataclasses import replace

    from inference import run_inference
    from training import LoopConfig
    records = [VideoRecord(name, name, 0, n, 0, (1, n + 1))
               for name, n in (('a', 20), ('b', 9), ('c', 14))]
    spatial = build_eval_transform(32, mean=[0.5] * 3, std=[0.25] * 3, crop='three')
    ds = VideoWindowDataset(records, PositionLoader(), TemporalEvenCrop(4, n_samples=2), spatial)
    loader = DeviceLoader(DataLoader(ds, batch_size=2, sampler=ds.shard(ctx.rank, ctx.world_size)),
                          ToDevice(ctx.device))
    model = _tiny_model()
    config = replace(LoopConfig(), progress_bar=False)
    out = run_inference(loader, model, ['w', 'x', 'y', 'z'], ctx, config, out_path.with_suffix(
        f'.{ctx.world_size}.json'), topk=0, feature_module=model.fc)
    if ctx.is_main:
        torch.save({'results': out.results, 'views': out.views, 'features': out.features},
                   out_path.with_suffix(f'.{ctx.world_size}.pth'))


@pytest.mark.slow
def test_multiview_inference_on_two_ranks_equals_one(tmp_path, rank_pool):
    from utils.distributed import DistContext
    _infer_worker(DistContext(), tmp_path / 'out')
    rank_pool.run(_infer_worker, tmp_path / 'out')
    one, two = (torch.load(tmp_path / f'out.{n}.pth', weights_only=True) for n in (1, 2))
    assert list(one['results']) == list(two['results']) == ['a', 'b', 'c']
    assert one['views'] == two['views'] == {'a': 6, 'b': 6, 'c': 6}
    for v in 'abc':
        assert [e['label'] for e in one['results'][v]] == [e['label'] for e in two['results'][v]]
        assert [e['score'] for e in two['results'][v]] == pytest.approx(
            [e['score'] for e in one['results'][v]], abs=1e-6)
        torch.testing.assert_close(one['features'][v], two['features'][v])
    written = json.loads((tmp_path / 'out.2.json').read_text())
    assert written['views'] == {'a': 6, 'b': 6, 'c': 6} and list(written['results']) == ['a', 'b', 'c']


# ActivityNet: one record per annotated segment, several records per video.
# 'a' has three segments; with plain per-record sharding its segments would
# fall on both ranks (rank 0: b, a[0]; rank 1: a[1], a[2], c).
SEGMENT_RECORDS = [VideoRecord('b', 'b', 0, 9, 1, (1, 10)),
                   VideoRecord('a', 'a', 0, 20, 0, (1, 21)),
                   VideoRecord('a', 'a', 24, 10, 2, (25, 35)),
                   VideoRecord('a', 'a', 36, 8, 2, (37, 45)),
                   VideoRecord('c', 'c', 0, 14, 3, (1, 15))]


def _segment_dataset(crop='center', table=False):
    """table: the records as main.py holds them, a RecordTable (video ids in
    bytes, no VideoRecord objects)."""
    from datasets.video_index import RecordTable
    spatial = build_eval_transform(32, mean=[0.5] * 3, std=[0.25] * 3, crop=crop)
    records = RecordTable.from_records(SEGMENT_RECORDS, '/videos') if table else SEGMENT_RECORDS
    ds = VideoWindowDataset(records, PositionLoader(), TemporalEvenCrop(4, n_samples=2), spatial)
    return ds


def _segment_infer_worker(ctx, out_path, average, table=False):
    from dataclasses import replace

    from inference import run_inference
    from training import LoopConfig
    ds = _segment_dataset(table=table)
    loader = DeviceLoader(DataLoader(ds, batch_size=3, sampler=ds.shard(ctx.rank, ctx.world_size)),
                          ToDevice(ctx.device))
    model = _tiny_model()
    out = run_inference(loader, model, ['w', 'x', 'y', 'z'], ctx,
                        replace(LoopConfig(), progress_bar=False),
                        out_path.with_suffix(f'.{ctx.world_size}.json'), topk=0, average=average,
                        feature_module=model.fc if average else None)
    if ctx.is_main:
        torch.save({'results': out.results, 'views': out.views, 'features': out.features},
                   out_path.with_suffix(f'.{ctx.world_size}.pth'))


def _by_hand_segment_views():
    """{video_id: [softmax of each window of each of its segments]}, in order."""
    ds, model = _segment_dataset(), _tiny_model()
    views = {}
    for i in range(len(ds)):
        clip, v, _ = ds[i]
        with torch.no_grad():
            p = model(clip[None])[0].softmax(0)
        views.setdefault(SEGMENT_RECORDS[v].video_id, []).append(p)
    return views


@pytest.mark.slow
@pytest.mark.parametrize('table', [False, True], ids=['records', 'record_table'])
def test_every_segment_of_a_video_counts_toward_its_score(tmp_path, table):
    from utils.distributed import DistContext
    _segment_infer_worker(DistContext(), tmp_path / 'out', True, table)
    one = torch.load(tmp_path / 'out.1.pth', weights_only=True)
    expected = _by_hand_segment_views()
    assert one['views'] == {'b': 2, 'a': 6, 'c': 2}  # 2 windows per segment
    assert list(one['results']) == ['b', 'a', 'c']  # annotation order, each video once
    for v, views in expected.items():
        scores = {e['label']: e['score'] for e in one['results'][v]}
        mean = torch.stack(views).mean(0)
        assert [scores[name] for name in 'wxyz'] == pytest.approx(mean.tolist(), abs=1e-6), v
    written = json.loads((tmp_path / 'out.1.json').read_text())
    assert written['views'] == {'b': 2, 'a': 6, 'c': 2}


@pytest.mark.slow
def test_per_clip_output_keeps_every_segment(tmp_path):
    from utils.distributed import DistContext
    _segment_infer_worker(DistContext(), tmp_path / 'out', False)
    one = torch.load(tmp_path / 'out.1.pth', weights_only=True)
    assert one['views'] == {'b': 2, 'a': 6, 'c': 2}
    # window starts 0 and room of each segment, in the annotation's frame numbers
    assert [e['segment'] for e in one['results']['a']] == [
        [1, 5], [17, 21], [25, 29], [31, 35], [37, 41], [41, 45]]
    expected = _by_hand_segment_views()['a']
    for entry, p in zip(one['results']['a'], expected):
        scores = {e['label']: e['score'] for e in entry['result']}
        assert [scores[name] for name in 'wxyz'] == pytest.approx(p.tolist(), abs=1e-6)


@pytest.mark.parametrize('table', [False, True], ids=['records', 'record_table'])
def test_shard_keeps_the_segments_of_a_video_on_one_rank(table):
    ds = _segment_dataset(table=table)
    shards = [list(ds.shard(r, 2)) for r in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(len(ds)))
    ids = [{SEGMENT_RECORDS[int(ds.video_of_item[i])].video_id for i in s} for s in shards]
    assert not ids[0] & ids[1], ids


@pytest.mark.parametrize('average', [True, False], ids=['average', 'per_clip'])
@pytest.mark.slow
def test_segment_inference_on_two_ranks_equals_one(tmp_path, average, rank_pool):
    from utils.distributed import DistContext
    _segment_infer_worker(DistContext(), tmp_path / 'out', average)
    # the two ranks hold a RecordTable, as in main.py: the same shard, the same scores
    rank_pool.run(_segment_infer_worker, tmp_path / 'out', average, True)
    one, two = (torch.load(tmp_path / f'out.{n}.pth', weights_only=True) for n in (1, 2))
    assert one['views'] == two['views'] == {'b': 2, 'a': 6, 'c': 2}
    assert list(one['results']) == list(two['results']) == ['b', 'a', 'c']
    # batches of 3 items are cut differently on two ranks: rounding differs, not labels
    for v in 'bac':
        flat = [_flat_entries(out['results'][v]) for out in (one, two)]
        assert [label for label, _ in flat[0]] == [label for label, _ in flat[1]]
        assert [s for _, s in flat[1]] == pytest.approx([s for _, s in flat[0]], abs=1e-6)
        if average:
            torch.testing.assert_close(one['features'][v], two['features'][v])


def _flat_entries(entries):
    """(segment/label, score) pairs of averaged or per-clip entries."""
    if entries and 'result' in entries[0]:
        return [((tuple(e['segment']), r['label']), r['score'])
                for e in entries for r in e['result']]
    return [(e['label'], e['score']) for e in entries]
