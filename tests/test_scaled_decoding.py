"""Decoding at the scale the clip needs: the crop is planned from the frame size,
the JPEG frames are decoded at the largest DCT reduction that keeps the crop at
least the output size, and the result is what full-size decoding gives, up to
the bounds stated here."""
import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from datasets import loader as loader_module
from datasets.annotation import VideoRecord
from datasets.loader import EncodedClip, JpgClipLoader
from datasets.spatial_transforms import (
    ClipPlan,
    KeepUint8,
    MultiScaleCornerCrop,
    build_eval_transform,
    build_train_transform,
    resized_size,
)
from datasets.temporal_transforms import TemporalEvenCrop, TemporalRandomCrop
from datasets.videodataset import VideoClipDataset
from utils.resumable_data import SeededSamples


def natural_frames(t=4, h=240, w=320, seed=0):
    """Frames with the spectrum of camera footage: a smooth colour field, oblique
    stripes moving 3 pixels a frame (edges at several scales) and fine noise."""
    rng = np.random.default_rng(seed)
    coarse = torch.from_numpy(rng.normal(128, 50, (1, 3, 8, 10)))
    smooth = torch.nn.functional.interpolate(coarse, size=(h, w), mode='bicubic',
                                             align_corners=True)[0].permute(1, 2, 0).numpy()
    y, x = np.mgrid[0:h, 0:w]
    return [np.clip(smooth + 30 * np.sin((x + 3 * f) / 3.0 + y / 7.0)[..., None]
                    + rng.normal(0, 6, (h, w, 3)), 0, 255).astype(np.uint8) for f in range(t)]


def jpeg_bytes(frames, quality=95):
    out = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, 'JPEG', quality=quality)
        out.append(buf.getvalue())
    return out


def encoded(data):
    return EncodedClip([data], [[f'frame{i}' for i in range(len(data))]], 'video')


def mad(a, b):
    return (a.int() - b.int()).abs().float().mean().item()


# ----------------------------------------------------------------------------- the rule

def test_reduction_is_the_largest_factor_keeping_the_crop_at_least_the_output():
    def factor(transform, h, w):
        return transform.plan((h, w)).reduction()
    ev112, ev56 = build_eval_transform(112), build_eval_transform(56)
    three = build_eval_transform(112, crop='three')
    assert factor(ev112, 240, 320) == 2  # 240 -> 112: 1/2 gives 120 >= 112, 1/4 60 < 112
    assert factor(three, 240, 320) == 2 and factor(build_eval_transform(112, crop='nocrop'),
                                                   240, 320) == 2
    assert factor(ev56, 240, 320) == 4 and factor(ev112, 480, 640) == 4
    assert factor(ev112, 1080, 1920) == 8 and factor(ev112, 2160, 3840) == 8  # 1/8 at most
    assert factor(ev112, 224, 300) == 2 and factor(ev112, 223, 300) == 1
    assert factor(build_eval_transform(32), 40, 40) == 1  # the synthetic demo: no reduction
    for train_crop in ('random', 'corner', 'center'):
        tr = build_train_transform(112, train_crop=train_crop)
        seen = set()
        for seed in range(200):
            torch.manual_seed(seed)
            plan = tr.plan((240, 320))
            f = plan.reduction()
            _, _, bh, bw = plan.box
            assert bh >= f * 112 and bw >= f * 112  # nothing upsampled that full size would not
            assert f == 8 or bh < 2 * f * 112 or bw < 2 * f * 112  # and the largest such f
            seen.add(f)
        assert seen == ({1, 2} if train_crop != 'center' else {2})


def test_box_at_reduced_scale_is_the_box_within_half_a_reduced_pixel():
    for seed in range(300):
        g = torch.Generator().manual_seed(seed)
        h, w = (int(v) for v in torch.randint(9, 700, (2,), generator=g))
        top, left = (int(torch.randint(0, n - 8, (), generator=g)) for n in (h, w))
        bh = int(torch.randint(8, h - top + 1, (), generator=g))
        bw = int(torch.randint(8, w - left + 1, (), generator=g))
        plan = ClipPlan((h, w), (top, left, bh, bw), (1, 1))
        assert plan.box_at(1) == plan.box
        for f in (2, 4, 8):
            t, lf, rh, rw = plan.box_at(f)
            assert 0 <= t and 0 <= lf and t + rh <= -(-h // f) and lf + rw <= -(-w // f)
            assert rh >= bh // f and rw >= bw // f
            for edge, full in ((t, top), (lf, left), (t + rh, top + bh), (lf + rw, left + bw)):
                assert abs(edge * f - full) <= f // 2


def test_resized_size_is_v2_resize():
    for h, w in [(240, 320), (320, 240), (241, 321), (100, 100), (37, 1000), (113, 112)]:
        for size in (16, 56, 112):
            clip = torch.zeros(1, 3, h, w, dtype=torch.uint8)
            assert tuple(v2.Resize(size)(clip).shape[-2:]) == resized_size(h, w, size)


# ----------------------------------------------------------------------------- the draws

def todays_train_pipeline(size, train_crop, **kw):
    """The v2 pipeline as it was before the crop was planned (crop step first)."""
    if train_crop == 'random':
        steps = [v2.RandomResizedCrop(size, scale=(0.25, 1.0), ratio=(0.75, 1 / 0.75),
                                      antialias=True)]
    elif train_crop == 'corner':
        steps = [MultiScaleCornerCrop(size)]
    else:
        steps = [v2.Resize(size, antialias=True), v2.CenterCrop(size)]
    steps.append(v2.RandomHorizontalFlip(0.5))
    if kw.get('colorjitter'):
        steps.append(v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1))
    if kw.get('randaugment'):
        steps.append(v2.RandAugment(*kw['randaugment']))
    return v2.Compose(steps)


@pytest.mark.parametrize('train_crop', ['random', 'corner', 'center'])
@pytest.mark.parametrize('extra', [{}, {'colorjitter': True, 'randaugment': (2, 9)}])
def test_planned_augmentation_draws_what_todays_pipeline_drew(train_crop, extra):
    """Same seed -> the same clip, bit for bit, as the v2 pipeline with the crop
    as its first step: the plan draws the crop's numbers first, in the same order."""
    g = torch.Generator().manual_seed(0)
    clip = torch.randint(0, 256, (3, 3, 60, 80), dtype=torch.uint8, generator=g)
    old = todays_train_pipeline(24, train_crop, **extra)
    new = build_train_transform(24, train_crop=train_crop, **extra)
    for seed in range(12):
        torch.manual_seed(seed)
        expected = old(tv_tensors.Video(clip)).as_subclass(torch.Tensor)
        torch.manual_seed(seed)
        assert torch.equal(new.augment(clip), expected), (train_crop, seed)
        torch.manual_seed(seed)
        plan = new.plan(clip.shape[-2:])  # planned before decoding, applied after
        assert torch.equal(new.augment(clip, plan, 1), expected)
        assert torch.rand(()).item() == (torch.manual_seed(seed), old(tv_tensors.Video(clip)),
                                         torch.rand(()).item())[2]  # the stream continues alike
    ev = build_eval_transform(24)
    assert torch.equal(ev.augment(clip), v2.Compose([v2.Resize(24), v2.CenterCrop(24)])(clip))


@pytest.mark.parametrize('train_crop', ['random', 'center'])
def test_clips_from_the_loaders_layout_are_todays_clips(train_crop):
    """From channels-last frames (as the JPEG loaders decode them), the augmented
    clip and both finishes (float, and uint8 for the device) are bit for bit what
    today's pipeline and finish gave, the flipped clips (made contiguous by the
    flip's own copy) as well as the others."""
    frames = torch.from_numpy(np.stack(natural_frames(t=3, h=60, w=80))).permute(0, 3, 1, 2)
    old = todays_train_pipeline(24, train_crop)
    new = build_train_transform(24, train_crop=train_crop)
    flipped = set()
    for seed in range(12):
        torch.manual_seed(seed)
        expected = old(tv_tensors.Video(frames)).as_subclass(torch.Tensor)
        torch.manual_seed(seed)
        got = new.augment(frames, new.plan(frames.shape[-2:]), 1)
        assert torch.equal(got, expected), (train_crop, seed)
        flipped.add(got.is_contiguous())
        assert torch.equal(new.finish(got), new.finish(expected))
        assert torch.equal(KeepUint8(new.finish)(got), expected.contiguous())
    assert flipped == {True, False}


# ----------------------------------------------------------------------------- accuracy

# Mean absolute difference (levels of 255) between decoding at the reduced scale
# and decoding at full size, each followed by the same plan, on natural_frames
# (240x320) at JPEG quality 95. Measured: eval to 112 (1/2) 0.90 (center and
# three crops), eval to 56 (1/4) 1.43 / 1.48; training crops (box on the reduced
# pixel grid) to 112 mean 0.91 (max 1.01), to 56 mean 0.73 (max 1.56). For
# scale: storing these frames as JPEG at quality 95 already costs 1.13 at 112
# (0.45 at 56) by the same measure (full-size decoding vs the uncompressed
# frames), and a box off by one reduced pixel gives 8.8 (14.1 at 56).
EVAL_BOUND = {112: 1.2, 56: 1.8}
TRAIN_BOUND = 1.2


@pytest.mark.parametrize('size, factor', [(112, 2), (56, 4)])
def test_reduced_decoding_matches_full_decoding_for_evaluation(size, factor):
    """JPEG frames decoded at 1/2 (DCT scaling) for evaluation to 112: mean absolute
    difference 0.90 levels from full-size decoding + the same resize (bound 1.2),
    less than JPEG storage at quality 95 itself costs (1.13); at 1/4 to 56: 1.43
    (bound 1.8)."""
    frames = natural_frames()
    clip = encoded(jpeg_bytes(frames))
    for crop in ('center', 'three'):
        transform = build_eval_transform(size, crop=crop)
        plan = transform.plan(clip.frame_size)
        assert plan.reduction() == factor
        reduced = clip.decode(factor)
        assert reduced.shape[-2:] == (240 // factor, 320 // factor)
        full = transform.augment(clip.decode(1), plan, 1)
        out = transform.augment(reduced, plan, factor)
        assert out.shape == full.shape
        assert mad(out, full) <= EVAL_BOUND[size], (crop, mad(out, full))
    transform = build_eval_transform(size)
    plan = transform.plan(clip.frame_size)
    if size == 112:  # at 1/2, less than what JPEG storage itself costs (full size vs raw)
        raw = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)
        assert mad(transform.augment(reduced, plan, factor), transform.augment(clip.decode(1))) < \
            mad(transform.augment(clip.decode(1)), transform.augment(raw))
    # the bound is tight enough to catch a box off by one reduced pixel
    shifted = ClipPlan(plan.frame, (factor, factor, 240 - factor, 320 - factor), plan.size)
    assert mad(transform.augment(reduced, shifted, factor),
               transform.augment(clip.decode(1), plan, 1)) > 3 * EVAL_BOUND[size]


def reduced_training_crop_diffs(read, full_frames, transform, seeds=range(40)) -> list:
    """Mean absolute differences between training crops decoded at a reduced scale
    and the same crops of the full-size ``full_frames``, over the ``seeds`` whose
    crop box allows a reduction (``read()``: the clip, read afresh where decoding
    consumes it).  The crop lands on the reduced pixel grid (within f/2 pixels of
    the drawn box, test above), so it is compared with that same box at full size."""
    diffs = []
    for seed in seeds:
        torch.manual_seed(seed)
        clip = read()
        plan = transform.plan(clip.frame_size)
        f = plan.reduction(clip.factors)
        if f == 1:
            continue
        out = transform.augment(clip.decode(f), plan, f)
        t, lf, h, w = plan.box_at(f)
        on_grid = plan._replace(box=(t * f, lf * f, h * f, w * f))
        diffs.append(mad(out, transform.augment(full_frames, on_grid, 1)))
    return diffs


@pytest.mark.parametrize('size', [112, 56])
def test_reduced_decoding_matches_full_decoding_for_training_crops(size):
    """Training crops decoded at the reduction their box allows: mean absolute
    difference from full-size decoding of the same box + resize 0.91 at 112 (max
    1.01), 0.73 at 56 (max 1.56); bound 1.2 (max 2.4)."""
    clip = encoded(jpeg_bytes(natural_frames()))
    transform = build_train_transform(size, hflip=False)
    diffs = reduced_training_crop_diffs(lambda: clip, clip.decode(1), transform)
    assert len(diffs) >= 5
    assert max(diffs) <= 2 * TRAIN_BOUND and np.mean(diffs) <= TRAIN_BOUND, diffs


# ----------------------------------------------------------------------------- data sets

def write_frames(folder, frames):
    folder.mkdir(parents=True)
    for p, data in enumerate(jpeg_bytes(frames)):
        (folder / f'image_{p + 1:05d}.jpg').write_bytes(data)
    return folder


@pytest.fixture
def decode_factors(monkeypatch):
    factors = []
    real = EncodedClip.decode

    def spy(self, factor=1):
        factors.append(factor)
        return real(self, factor)
    monkeypatch.setattr(loader_module.EncodedClip, 'decode', spy)
    return factors


def test_data_sets_decode_at_the_plans_scale(tmp_path, decode_factors):
    folder = write_frames(tmp_path / 'walk' / 'v', natural_frames(t=6))
    record = VideoRecord('v', str(folder), 0, 6, 0, (1, 7))
    mean, std = [0.5] * 3, [0.5] * 3
    val = VideoClipDataset([record], JpgClipLoader(), TemporalEvenCrop(4, 2),
                           build_eval_transform(112, mean=mean, std=std))
    clips, _ = val[0]
    assert decode_factors == [2] and clips.shape == (2, 3, 4, 112, 112)
    full = build_eval_transform(112, mean=mean, std=std)(JpgClipLoader()(folder, range(6)))
    assert (clips[0] - full[:, :4]).abs().mean().item() * 0.5 * 255 <= EVAL_BOUND[112]

    # training: each sample under its own seed (as main.py's loader); the same
    # draws as full-size decoding, which a loader without `read` gets
    class FullSize:
        def __call__(self, path, positions):
            return JpgClipLoader()(path, positions)

    transform = build_train_transform(112, mean=mean, std=std)

    def dataset(loader):
        return SeededSamples(VideoClipDataset([record] * 30, loader, TemporalRandomCrop(4),
                                              transform), manual_seed=5)
    planned, full = dataset(JpgClipLoader()), dataset(FullSize())
    plans = []
    real_plan = transform.plan
    transform.plan = lambda size: plans.append(real_plan(size)) or plans[-1]
    decode_factors.clear()
    for i in range(30):
        a = planned[i][0]
        plan, f = plans[-1], decode_factors[-1]
        assert torch.equal(a, planned[i][0])  # reproducible per sample
        b = full[i][0]
        assert plans[-1] == plan  # full-size decoding drew the same box
        if f == 1:
            assert torch.equal(a, b)
            continue
        # the crop and resize of this plan against full-size decoding of the box
        # on the reduced pixel grid (within f/2 pixels of the drawn one)
        t, lf, h, w = plan.box_at(f)
        on_grid = plan._replace(box=(t * f, lf * f, h * f, w * f))
        got = transform.geometry(JpgClipLoader().read(folder, range(6)).decode(f), plan, f)
        assert mad(got, transform.geometry(JpgClipLoader()(folder, range(6)), on_grid, 1)) \
            <= 2 * TRAIN_BOUND
    assert set(decode_factors) == {1, 2}


def test_flow_planes_decode_at_the_same_reduction(tmp_path):
    import h5py
    import simplejpeg
    gray = [jpeg_bytes([f[..., :1].repeat(3, -1)])[0] for f in natural_frames(t=3)]
    path = tmp_path / 'flow.hdf5'
    with h5py.File(path, 'w') as f:
        for key in ('video_u', 'video_v'):
            ds = f.create_dataset(key, (3,), dtype=h5py.vlen_dtype(np.uint8))
            for p, d in enumerate(gray if key == 'video_u' else gray[::-1]):
                ds[p] = np.frombuffer(d, dtype=np.uint8)
    from datasets.loader import Hdf5FlowLoader
    clip = Hdf5FlowLoader().read(path, [0, 1, 2]).decode(2)
    assert clip.shape == (3, 2, 120, 160)
    for p in range(3):
        for c, d in enumerate((gray[p], gray[2 - p])):
            half = simplejpeg.decode_jpeg(d, colorspace='GRAY', min_factor=2, min_height=120,
                                          min_width=160)
            assert torch.equal(clip[p, c], torch.from_numpy(half[..., 0]))
