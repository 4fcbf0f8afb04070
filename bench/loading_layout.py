"""bench/data_loading.py's layout section: where a clip's time goes after decoding
(the resized crop on uint8 against float, channels-last against channels-first,
the flip, the layout the model needs by each candidate)."""
import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF_v2

from bench import loading_timing as timing
from bench.loading_frames import encode_photo_jpeg, video_frames
from bench.loading_steps import resized_crop
from bench.loading_timing import CLIP
from datasets.spatial_transforms import (
    FlipToContiguous,
    build_eval_transform,
    build_train_transform,
    contiguous_clip,
    get_mean_std,
)


def decoded_clips(frames, quality, n_clips):
    """``n_clips`` 16-frame clips (the first frames of as many videos of ``frames``),
    JPEG-encoded (4:2:0, ``quality``) and decoded by the loader's decoder at 1/1 and
    1/2: [(encoded, full, half)], the frames uint8 (T, C, H, W) in channels-last memory."""
    from datasets.loader import EncodedClip
    out = []
    for v, images in enumerate(video_frames(frames, n_clips, CLIP, (240, 320))):
        data = [encode_photo_jpeg(img, quality) for img in images]
        encoded = EncodedClip([data], [[f'frame {i}' for i in range(CLIP)]], f'video {v}')
        out.append((encoded, encoded.decode(1), encoded.decode(2)))
    return out


def _lookup_normalizer(normalizer):
    """The normalizer as one pass: uint8 -> its channel's float from a 256-entry table
    of the normalizer's own float32 ops per value."""
    table = (torch.arange(256, dtype=torch.float32) * normalizer._gain.view(3, 1)
             - normalizer._bias.view(3, 1)).numpy()

    def lookup(clip):
        values = clip.numpy()
        out = np.empty((values.shape[1], values.shape[0], *values.shape[2:]), np.float32)
        for c in range(values.shape[1]):
            np.take(table[c], values[:, c], out=out[c])
        return torch.from_numpy(out)
    return lookup


def _after_decoding_variants(i, clip, train, val) -> dict:
    """{(step, variant): what to time} for clip i of decoded_clips, with its seeded training box."""
    encoded, full, half = clip
    normalizer = train.finish
    lookup = _lookup_normalizer(normalizer)
    v2_flip, our_flip = v2.RandomHorizontalFlip(1.0), FlipToContiguous(1.0)
    torch.manual_seed(i)
    plan = train.plan(full.shape[-2:])
    factor = plan.reduction()
    box, size = plan.box_at(factor), list(plan.size)
    decoded = full if factor == 1 else half
    first = decoded.contiguous()
    crop = TF_v2.resized_crop(decoded, *box, size, antialias=True)
    val_plan = val.plan(full.shape[-2:])
    variants = {
        ('decode 16 frames', '1/1'): lambda e=encoded: e.decode(1),
        ('decode 16 frames', '1/2'): lambda e=encoded: e.decode(2),
        ('resized crop (training box)', 'uint8, channels-last (ours)'):
            lambda d=decoded, b=box, s=size: TF_v2.resized_crop(d, *b, s, antialias=True),
        ('resized crop (training box)', 'uint8, channels-first'):
            lambda d=first, b=box, s=size: TF_v2.resized_crop(d, *b, s, antialias=True),
        ('resized crop (training box)', 'float, channels-last (conversion included)'):
            lambda d=decoded, b=box, s=size: TF_v2.resized_crop(d.float(), *b, s, antialias=True),
        ('resized crop (training box)', 'float, channels-first (conversion included)'):
            lambda d=first, b=box, s=size: TF_v2.resized_crop(d.float(), *b, s, antialias=True),
        ('resized crop (evaluation, from 1/2)', 'uint8, channels-last (ours)'):
            lambda d=half, p=val_plan: resized_crop(val, d, p, 2),
        ('flip + layout float', 'before: v2.RandomHorizontalFlip, NormalizeToInput'):
            lambda c=crop: normalizer(v2_flip(tv_tensors.Video(c))),
        ('flip + layout float', 'ours: FlipToContiguous, NormalizeToInput'):
            lambda c=crop: normalizer(our_flip(tv_tensors.Video(c))),
        ('flip + layout uint8', 'before: v2.RandomHorizontalFlip, contiguous_clip'):
            lambda c=crop: contiguous_clip(v2_flip(tv_tensors.Video(c))),
        ('flip + layout uint8', 'ours: FlipToContiguous, contiguous_clip'):
            lambda c=crop: contiguous_clip(our_flip(tv_tensors.Video(c))),
        ('flip alone', 'Tensor.flip'): lambda c=crop: c.flip(-1),
        ('layout float (no flip)', "ours: NormalizeToInput (torch's permuting float copy, multiply, "
                                   "subtract)"): lambda c=crop: normalizer(c),
        ('layout float (no flip)', 'numpy transposing uint8 copy, then float, multiply, subtract'):
            lambda c=crop: normalizer(contiguous_clip(c.movedim(-3, -4)).movedim(-4, -3)),
        ('layout float (no flip)', 'fused: 256-entry lookup table (numpy take)'): lambda c=crop: lookup(c),
        ('layout uint8 (no flip)', 'Tensor.contiguous'): lambda c=crop: c.contiguous(),
        ('layout uint8 (no flip)', 'ours: contiguous_clip'): lambda c=crop: contiguous_clip(c),
    }
    assert torch.equal(lookup(crop), normalizer(crop))  # the same values
    return variants


def after_decoding_costs(frames, quality, n_clips=8, rounds=30) -> None:
    """Where a clip's time goes after decoding (ms a clip: each clip's best of
    ``rounds``, the mean over ``n_clips`` clips of ``frames``, each with its seeded
    training box): the resized crop on uint8 against float, channels-last against
    channels-first memory; the flip; the layout the model needs (float (C, T, H, W)
    normalized, or uint8 (T, C, H, W) contiguous) by each candidate; the decode itself."""
    mean, std = get_mean_std(1)
    train, val = build_train_transform(112, mean=mean, std=std), build_eval_transform(112, mean=mean, std=std)
    clips = decoded_clips(frames, quality, n_clips)
    cases = {i: _after_decoding_variants(i, clip, train, val) for i, clip in enumerate(clips)}
    best = {key: [float('inf')] * len(clips) for key in cases[0]}
    for _ in range(rounds):  # the variants interleaved, each clip's fastest round
        for i in cases:
            for key, fn in cases[i].items():
                start = timing.clock()
                fn()
                best[key][i] = min(best[key][i], timing.clock() - start)
    print(f'\nafter decoding, {frames} frames (JPEG quality {quality}), {CLIP}x3x240x320 -> '
          f'{CLIP}x3x112x112, one thread (ms a clip, mean of {len(clips)} clips, each its best of '
          f'{rounds} rounds)')
    print('| step | variant | ms |')
    print('|---|---|---:|')
    for (step, variant), times in best.items():
        print(f'| {step} | {variant} | {sum(times) / len(times) * 1e3:.3f} |')
