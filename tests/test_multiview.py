"""Multi-view testing pieces: evenly spread clips one item at a time, three
crops along the long side, and the data set that serves them."""
import numpy as np
import pytest
import torch

from datasets.annotation import VideoRecord
from datasets.spatial_transforms import (ThreeCropTransform, build_eval_transform,
                                         three_crop_boxes)
from datasets.temporal_transforms import TemporalEvenCrop
from datasets.videodataset import VideoWindowDataset


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
    out = t(clip)  # normalised, (K, C, T, H, W); identity statistics at scale 255
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
    # deferred normalisation: uint8 (K, T, C, H, W), normalised after the copy
    normaliser = spatial.defer_normalisation()
    raw, _, _ = ds[1]
    assert raw.dtype == torch.uint8 and raw.shape == (3, 4, 3, 32, 32)
    torch.testing.assert_close(normaliser(raw), clip_a1)


def _tiny_model(n_classes=4):
    from models import resnet
    torch.manual_seed(0)
    return resnet.generate_model(10, widen_factor=0.25, n_classes=n_classes).eval()


def test_view_scores_are_the_mean_over_views_by_hand():
    from torch.utils.data import DataLoader

    from inference import ViewScores, score_views
    records = [VideoRecord('a', 'a', 0, 20, 0, (1, 21)), VideoRecord('b', 'b', 0, 9, 1, (1, 10))]
    even = TemporalEvenCrop(4, n_samples=2)
    mean, std = [0.5] * 3, [0.25] * 3
    spatial = build_eval_transform(32, mean=mean, std=std, crop='three')
    ds = VideoWindowDataset(records, PositionLoader(), even, spatial)
    model = _tiny_model()
    scores = ViewScores(keep_views=True)
    # batches of 3 items cross the boundary between the two videos
    for batch in score_views(DataLoader(ds, batch_size=3), model, torch.device('cpu')):
        scores.add(*batch)
    for v, record in enumerate(records):
        views = []
        for k in range(2):
            frames = PositionLoader()(record.path, even.window(record.positions, k))
            for top, left, h, w in three_crop_boxes(32, 48, 32):
                crop = frames[..., top:top + h, left:left + w].float() / 255
                x = ((crop - 0.5) / 0.25).movedim(1, 0)[None]  # (1, C, T, H, W)
                with torch.no_grad():
                    views.append(model(x).softmax(1)[0])
        assert scores.counts[v] == 6
        torch.testing.assert_close(scores.mean(v), torch.stack(views).mean(0), rtol=1e-5,
                                   atol=1e-6)
        kept = torch.stack([p for _, _, p in scores.views[v]])
        torch.testing.assert_close(kept, torch.stack(views), rtol=1e-5, atol=1e-6)
        assert [crop for _, crop, _ in scores.views[v]] == [0, 1, 2] * 2
