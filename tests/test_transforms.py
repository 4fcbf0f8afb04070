"""Temporal and spatial transforms."""
import random

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from datasets.spatial_transforms import (
    MEAN_STD,
    FlipToContiguous,
    KeepUint8,
    MultiScaleCornerCrop,
    NormalizeToInput,
    ThreeCropTransform,
    build_eval_transform,
    build_train_transform,
    contiguous_clip,
    flipped_contiguous_clip,
    get_mean_std,
)
from datasets.temporal_transforms import (
    SlidingWindow,
    TemporalCenterCrop,
    TemporalEvenCrop,
    TemporalRandomCrop,
)

# ----------------------------------------------------------------------------- temporal


@pytest.mark.parametrize('t_stride, expected_starts', [(1, range(0, 7)), (2, range(0, 4))])
def test_random_crop_reaches_every_start_including_last(t_stride, expected_starts):
    # 10 frames, 4-frame clips: span 4 (stride 1) -> starts 0..6; span 7 (stride 2) -> 0..3
    crop = TemporalRandomCrop(4, t_stride, rng=random.Random(0))
    starts = set()
    for _ in range(400):
        clip = crop(range(10))
        assert clip == [clip[0] + k * t_stride for k in range(4)]
        starts.add(clip[0])
    assert starts == set(expected_starts)


def test_random_crop_uses_global_random_state_by_default():
    crop = TemporalRandomCrop(4)
    random.seed(123)
    a = [crop(range(100)) for _ in range(5)]
    random.seed(123)
    b = [crop(range(100)) for _ in range(5)]
    assert a == b and len({c[0] for c in a}) > 1


def test_first_frame_n_frames_call_and_positions_list():
    assert TemporalCenterCrop(4)(5, 4) == [5, 6, 7, 8]
    assert TemporalRandomCrop(4)(5, 4) == [5, 6, 7, 8]
    assert TemporalCenterCrop(2)([10, 20, 30, 40]) == [20, 30]


def test_loop_padding_short_videos():
    assert TemporalRandomCrop(8)(range(3)) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert TemporalCenterCrop(8)(range(3)) == [0, 1, 2, 0, 1, 2, 0, 1]
    # stride 2 on 5 frames: available 0, 2, 4, repeated
    assert TemporalRandomCrop(8, 2)(range(5)) == [0, 2, 4, 0, 2, 4, 0, 2]
    assert TemporalCenterCrop(4, 3)(10, 5) == [10, 13, 10, 13]


def test_center_crop_with_stride():
    assert TemporalCenterCrop(4)(range(10)) == [3, 4, 5, 6]
    assert TemporalCenterCrop(4, 2)(range(10)) == [1, 3, 5, 7]  # span 7, start (10-7)//2


def test_even_crop_one_and_three_samples():
    assert TemporalEvenCrop(4, 1)(range(10)) == [[3, 4, 5, 6]]
    assert TemporalEvenCrop(4, 3)(range(10)) == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    # stride 2, 20 frames: span 7, room 13 -> starts 0, 6, 13
    assert TemporalEvenCrop(4, 3, 2)(range(20)) == [[0, 2, 4, 6], [6, 8, 10, 12],
                                                    [13, 15, 17, 19]]
    # offset video (first_frame 100)
    assert TemporalEvenCrop(2, 2)(100, 5) == [[100, 101], [103, 104]]
    # short video: clips coincide, loop-padded
    assert TemporalEvenCrop(4, 3)(range(2)) == [[0, 1, 0, 1]] * 3


def test_sliding_window_covers_the_end():
    sw = SlidingWindow(4, 4)
    assert sw(range(8)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sw(range(10)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 8, 9]]
    assert sw(range(3)) == [[0, 1, 2, 0]]
    for size, ws, ts in [(4, 4, 1), (4, 2, 1), (3, 3, 2), (16, 16, 1), (2, 16, 1), (5, 7, 3)]:
        sw = SlidingWindow(size, ws, ts)
        for n in range(1, 60):
            windows = sw(range(n))
            assert len(windows) == sw.n_windows(n)
            assert all(len(w) == size for w in windows)
            assert sw.start(n, len(windows) - 1) + sw.span >= n  # last window reaches the end
            if len(windows) > 1:  # and the one before does not
                assert sw.start(n, len(windows) - 2) + sw.span < n
            assert windows == [sw.window(range(n), k) for k in range(len(windows))]
            if ts == 1 and ws <= size:
                assert set().union(*map(set, windows)) == set(range(n))


# ----------------------------------------------------------------------------- spatial

def textured_clip(t=4, h=48, w=56, step=10, seed=0):
    """Frames that are the same random texture plus ``step * t`` (no clipping)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 200, (1, 3, h, w), generator=g, dtype=torch.uint8)
    offsets = (torch.arange(t, dtype=torch.uint8) * step).view(t, 1, 1, 1)
    return base + offsets


@pytest.mark.parametrize('crop', ['random', 'corner', 'center'])
def test_one_crop_box_for_all_frames(crop):
    clip = textured_clip()
    tr = build_train_transform(24, train_crop=crop, min_scale=0.25, hflip=True)
    for seed in range(8):
        torch.manual_seed(seed)
        out = tr.augment(clip).int()
        assert out.shape == (4, 3, 24, 24)
        for t in range(1, 4):
            # same box and flip => frame t is frame 0 plus 10 t (up to uint8 rounding)
            assert (out[t] - out[0] - 10 * t).abs().max() <= 1, (crop, seed, t)


def test_different_boxes_across_calls():
    clip = textured_clip()
    tr = build_train_transform(24, train_crop='random', hflip=False)
    outs = [tr.augment(clip) for _ in range(4)]
    assert any(not torch.equal(outs[0], o) for o in outs[1:])


def test_flip_all_frames_or_none():
    clip = textured_clip(h=24, w=24)
    tr = build_train_transform(24, train_crop='center', hflip=True)
    seen = set()
    for seed in range(20):
        torch.manual_seed(seed)
        out = tr.augment(clip)
        if torch.equal(out, clip):
            seen.add('kept')
        else:
            assert torch.equal(out, clip.flip(-1))
            seen.add('flipped')
    assert seen == {'kept', 'flipped'}
    no_flip = build_train_transform(24, train_crop='center', hflip=False)
    assert all(torch.equal(no_flip.augment(clip), clip) for _ in range(10))


def test_colorjitter_changes_clip_with_one_draw_per_clip():
    base = textured_clip(t=1, h=24, w=24)
    clip = base.expand(5, -1, -1, -1).contiguous()  # 5 identical frames
    plain = build_train_transform(24, train_crop='center', hflip=False)
    jitter = build_train_transform(24, train_crop='center', hflip=False, colorjitter=True)
    changed = 0
    for seed in range(5):
        torch.manual_seed(seed)
        out = jitter.augment(clip)
        assert all(torch.equal(out[0], out[t]) for t in range(1, 5))  # same parameters
        changed += (out.int() - plain.augment(clip).int()).abs().float().mean().item() > 2
    assert changed >= 4


def test_normalization_matches_hand_computation():
    clip = textured_clip(h=16, w=16)
    x = clip.double() / 255
    for dataset in ('kinetics', 'activitynet', '0.5'):
        m, s = (torch.tensor(v, dtype=torch.float64).view(1, 3, 1, 1) for v in MEAN_STD[dataset])
        expected = ((x - m) / s).permute(1, 0, 2, 3)
        for vs in (1, 255):
            mean, std = get_mean_std(vs, dataset)
            out = build_eval_transform(16, mean=mean, std=std, value_scale=vs)(clip)
            assert out.dtype == torch.float32 and out.shape == (3, 4, 16, 16)
            assert out.is_contiguous()
            assert torch.allclose(out.double(), expected, atol=1e-5)
    # value_scale 255 without std normalization: x - 255 * mean
    mean, std = get_mean_std(255, 'kinetics', no_std_norm=True)
    out = build_eval_transform(16, mean=mean, std=std, value_scale=255)(clip)
    m = torch.tensor(MEAN_STD['kinetics'][0], dtype=torch.float64).view(1, 3, 1, 1)
    assert torch.allclose(out.double(), (clip.double() - 255 * m).permute(1, 0, 2, 3),
                          atol=1e-3)
    # no normalization at all, value_scale 1: x / 255
    mean, std = get_mean_std(1, 'kinetics', no_mean_norm=True, no_std_norm=True)
    assert mean == [0, 0, 0] and std == [1, 1, 1]
    out = build_eval_transform(16, mean=mean, std=std)(clip)
    assert torch.allclose(out.double(), (clip.double() / 255).permute(1, 0, 2, 3), atol=1e-6)


def test_normalize_batched_and_two_channel():
    norm = NormalizeToInput([0.5, 0.25, 0.1], [0.5, 0.5, 0.5], 1)
    clips = textured_clip(h=8, w=8).expand(2, -1, -1, -1, -1)  # (N, T, C, H, W)
    out = norm(clips)
    assert out.shape == (2, 3, 4, 8, 8)
    assert torch.allclose(out[1], norm(clips[1]))
    flow = clips[0, :, :2]
    out = norm(flow)
    assert out.shape == (2, 4, 8, 8)
    assert torch.allclose(out[1], (flow[:, 1].float() / 255 - 0.25) / 0.5, atol=1e-6)


def test_get_mean_std_values():
    assert get_mean_std(1, 'kinetics') == ([0.4345, 0.4051, 0.3775], [0.2768, 0.2713, 0.2737])
    assert get_mean_std(1, 'activitynet') == ([0.4477, 0.4209, 0.3906],
                                              [0.2767, 0.2695, 0.2714])
    assert get_mean_std(255, '0.5') == ([0.5] * 3, [0.5] * 3)
    assert get_mean_std(255, 'kinetics', no_std_norm=True)[1] == [1 / 255] * 3
    with pytest.raises(ValueError):
        get_mean_std(1, 'imagenet21k')


def test_corner_crop_boxes():
    t = MultiScaleCornerCrop(16)
    x = torch.zeros(2, 3, 40, 60, dtype=torch.uint8)
    sizes = {int(40 * s) for s in (1, 2 ** -0.25, 2 ** -0.5, 2 ** -0.75, 0.5)}
    seen_sizes, seen_pos = set(), set()
    for _ in range(300):
        p = t.make_params([x])
        assert p['height'] == p['width'] and p['height'] in sizes
        c = p['height']
        pos = {(0, 0): 'tl', (0, 60 - c): 'tr', (40 - c, 0): 'bl', (40 - c, 60 - c): 'br',
               ((40 - c) // 2, (60 - c) // 2): 'c'}[(p['top'], p['left'])]
        seen_sizes.add(c)
        seen_pos.add(pos)
    assert seen_sizes == sizes and seen_pos == {'c', 'tl', 'tr', 'bl', 'br'}
    assert t(x).shape == (2, 3, 16, 16)


def test_eval_transform_shapes():
    clip = torch.randint(0, 255, (3, 3, 32, 48), dtype=torch.uint8)
    assert build_eval_transform(16)(clip).shape == (3, 3, 16, 16)
    assert build_eval_transform(16, crop='nocrop')(clip).shape == (3, 3, 16, 24)
    # resize + center crop of a clip whose frames are one constant colour stays that colour
    const = torch.full((2, 3, 30, 40), 128, dtype=torch.uint8)
    out = build_eval_transform(10, mean=[0, 0, 0], std=[1, 1, 1])(const)
    assert torch.allclose(out, torch.full_like(out, 128 / 255))
    with pytest.raises(ValueError):
        build_eval_transform(16, crop='tencrop')
    with pytest.raises(ValueError):
        build_train_transform(16, train_crop='diagonal')


def test_train_output_layout_from_channels_last_input():
    frames = textured_clip(t=3, h=40, w=40)
    cl = frames.contiguous(memory_format=torch.channels_last)
    tr = build_train_transform(32, hflip=False, train_crop='center')
    a, b = tr(frames), tr(cl)
    assert a.shape == (3, 3, 32, 32) and a.dtype == torch.float32 and a.is_contiguous()
    assert torch.allclose(a, b)


def _channels_last(t=4, h=20, w=28):
    """A uint8 (T, C, H, W) clip in the memory order the JPEG loaders and the
    uint8 resize give: (T, H, W, C)."""
    return textured_clip(t=t, h=h, w=w).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


@pytest.mark.parametrize('view', ['whole', 'crop', 'flip', 'batched', 'indexed'])
def test_contiguous_clip_equals_tensor_contiguous(view):
    clip = _channels_last()
    clip = {'whole': clip, 'crop': clip[..., 3:17, 5:25],
            'flip': clip[..., 2:18, :].flip(-1), 'batched': clip.unsqueeze(0).expand(2, -1, -1, -1, -1),
            'indexed': clip[..., ::2]}[view]
    assert not clip.is_contiguous()
    out = contiguous_clip(clip)
    assert out.is_contiguous() and out.shape == clip.shape and out.dtype == torch.uint8
    assert torch.equal(out, clip.contiguous())
    floats = clip.float()  # not uint8: torch's own copy
    assert torch.equal(contiguous_clip(floats), floats.contiguous())


def test_normalize_and_keep_uint8_from_channels_last():
    clip = _channels_last()
    norm = NormalizeToInput([0.5, 0.25, 0.1], [0.5, 0.4, 0.3], 1)
    ref = (clip.contiguous().double().permute(1, 0, 2, 3) / 255
           - torch.tensor([0.5, 0.25, 0.1], dtype=torch.float64).view(3, 1, 1, 1)) \
        / torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64).view(3, 1, 1, 1)
    out = norm(clip)
    assert out.is_contiguous() and torch.allclose(out.double(), ref, atol=1e-5)
    kept = KeepUint8(norm)(clip)
    assert kept.is_contiguous() and torch.equal(kept, clip.contiguous())


def test_three_crops_are_the_crops_of_the_resized_clip():
    clip = _channels_last(h=24, w=40)
    three = ThreeCropTransform(16, NormalizeToInput([0] * 3, [1] * 3))
    crops = three.augment(clip)
    resized = build_eval_transform(16, crop='nocrop').augment(clip)  # 16x26
    assert crops.is_contiguous() and crops.shape == (3, 4, 3, 16, 16)
    for crop, left in zip(crops, (0, 5, 10)):
        assert torch.equal(crop, resized[..., left:left + 16])


@pytest.mark.parametrize('view', ['channels_last', 'crop', 'contiguous'])
def test_flip_to_contiguous_is_v2_flip_in_contiguous_memory(view):
    clip = _channels_last(h=20, w=28)
    clip = {'channels_last': clip, 'crop': clip[..., 2:18, 3:25], 'contiguous': clip.contiguous()}[view]
    for inpt in (clip, tv_tensors.Video(clip)):
        out = FlipToContiguous(1.0)(inpt)
        assert type(out) is type(inpt) and out.is_contiguous()
        assert torch.equal(out, clip.flip(-1)) and torch.equal(out, v2.RandomHorizontalFlip(1.0)(inpt))
        assert FlipToContiguous(0.0)(inpt) is inpt
        assert torch.equal(flipped_contiguous_clip(inpt), clip.flip(-1))
    floats = clip.float()  # not uint8: torch's own flip
    assert torch.equal(FlipToContiguous(1.0)(floats), floats.flip(-1))


def test_flip_to_contiguous_draws_what_v2_flip_draws():
    clip = tv_tensors.Video(_channels_last())
    flips = []
    for transform in (v2.RandomHorizontalFlip(0.5), FlipToContiguous(0.5)):
        torch.manual_seed(0)
        flips.append([(torch.equal(transform(clip), clip.flip(-1)), torch.rand(()).item()) for _ in range(12)])
    assert flips[0] == flips[1] and {f for f, _ in flips[0]} == {True, False}


def test_training_flip_leaves_the_layout_the_finish_needs():
    """The default training transform's flip (its last step) makes the clip
    contiguous in the same copy; with steps after it, the v2 flip (their input
    layout as before)."""
    clip = _channels_last(h=40, w=48)
    plain, jitter = build_train_transform(24), build_train_transform(24, colorjitter=True)
    assert isinstance(plain.augment_transform.transforms[-1], FlipToContiguous)
    assert type(jitter.augment_transform.transforms[0]) is v2.RandomHorizontalFlip
    layouts = set()
    for seed in range(10):
        torch.manual_seed(seed)
        out = plain.augment(clip)
        flipped = out.is_contiguous()
        layouts.add(flipped)
        if not flipped:  # the resize's channels-last memory, not copied
            assert out.is_contiguous(memory_format=torch.channels_last)
        kept = KeepUint8(plain.finish)(out)
        assert torch.equal(kept, out) and (kept.data_ptr() == out.data_ptr()) == flipped
    assert layouts == {True, False}
