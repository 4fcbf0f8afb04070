"""bench/data_loading.py's steps section: ours on the jpg frames against the sum of
its unavoidable steps (read + decode at the plan's scale, the resized crop, the
layout the model needs) and against full-size decoding (issue 25's targets)."""
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF_v2

from bench.loading_timing import OUTPUTS, best_of_rounds, planned_clip
from datasets.loader import JpgClipLoader
from datasets.spatial_transforms import (
    KeepUint8,
    build_eval_transform,
    build_train_transform,
    contiguous_clip,
    get_mean_std,
)


def resized_crop(transform, clip, plan, factor, size=112):
    """The clip's geometric step alone: the plan's box resized (the short side for
    evaluation, then the center crop: a view)."""
    out = transform.geometry(clip, plan, factor)
    return TF_v2.center_crop(out, [size, size])


def step_rows(paths, n_clips, n_frames, rounds=5):
    """{row: clips/s} on the jpg frames, training and evaluation transforms: ours
    (normalized to float, or uint8 for the device) against its unavoidable steps:
    read + decode at the plan's scale ('scaled'), + the resized crop ('scaled_crop'),
    + the layout the model needs ('scaled_crop_float': the normalizer alone,
    'scaled_crop_uint8': contiguous_clip alone; no flip, no v2 pipeline), and
    full-size decoding ('full', the same for both) + the same crop ('full_crop');
    and ours with the v2 flip, as before issue 25 ('train_before_*')."""
    mean, std = get_mean_std(1)
    transforms = {'train': build_train_transform(112, mean=mean, std=std),
                  'val': build_eval_transform(112, mean=mean, std=std)}
    layouts = {'float': transforms['val'].finish, 'uint8': contiguous_clip}
    loader = JpgClipLoader()

    def steps(transform, crop=False, layout=None, full=False):
        def clip(path, positions):
            encoded = loader.read(str(path), positions)
            plan = transform.plan(encoded.frame_size)
            factor = 1 if full else plan.reduction(encoded.factors)
            out = encoded.decode(factor)
            if crop:
                out = resized_crop(transform, out, plan, factor)
            return layout(out) if layout else out
        return clip
    before = build_train_transform(112, mean=mean, std=std)  # the v2 flip (until issue 25)
    before.augment_transform.transforms[-1] = v2.RandomHorizontalFlip(0.5)
    runs = {'full': (steps(transforms['val'], full=True), 'jpg'),
            'train_before_float': (lambda p, pos: planned_clip(loader, before, p, pos), 'jpg'),
            'train_before_uint8': (lambda p, pos: planned_clip(
                loader, before, p, pos, KeepUint8(before.finish)), 'jpg')}
    for kind, t in transforms.items():
        runs[f'{kind}_ours_float'] = (lambda p, pos, t=t: planned_clip(loader, t, p, pos), 'jpg')
        runs[f'{kind}_ours_uint8'] = (lambda p, pos, t=t: planned_clip(
            loader, t, p, pos, KeepUint8(t.finish)), 'jpg')
        runs[f'{kind}_scaled'] = (steps(t), 'jpg')
        runs[f'{kind}_scaled_crop'] = (steps(t, crop=True), 'jpg')
        for output, layout in layouts.items():
            runs[f'{kind}_scaled_crop_{output}'] = (steps(t, crop=True, layout=layout), 'jpg')
        runs[f'{kind}_full_crop'] = (steps(t, crop=True, full=True), 'jpg')
    return best_of_rounds(runs, paths, n_clips, n_frames, rounds)


def print_step_table(rates, frames, quality, frame_kb):
    """ms a clip, from step_rows's clips/s, and the ratios of issue 25's targets."""
    ms = {row: 1e3 / rate for row, rate in rates.items()}
    print(f'\nsteps of a clip, jpg frames ({frames}, JPEG quality {quality}, {frame_kb:.1f} kB a frame), '
          f'16-frame clips -> 3x16x112x112, one process, one thread (ms a clip). decode: read + '
          f'decode the 16 frames at the scale the plan allows (training: mostly 1/1; evaluation: '
          f'1/2); crop: the resized crop alone; layout: the normalizer (float) or contiguous_clip '
          f'(uint8) alone; full decode: read + decode at 1/1')
    print('| transform | output | ours | before (v2 flip) | decode | decode + crop '
          '| decode + crop + layout | ours / (decode + crop) | ours / (decode + crop + layout) '
          '| full decode + crop | (full decode + crop) / ours | full decode / ours |')
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for kind in ('train', 'val'):
        for output in OUTPUTS:
            ours, crop = ms[f'{kind}_ours_{output}'], ms[f'{kind}_scaled_crop']
            layout, full_crop = ms[f'{kind}_scaled_crop_{output}'], ms[f'{kind}_full_crop']
            before = f'{ms[f"{kind}_before_{output}"]:.2f}' if kind == 'train' else ''
            print(f'| {kind} | {output} | {ours:.2f} | {before} | {ms[f"{kind}_scaled"]:.2f} '
                  f'| {crop:.2f} | {layout:.2f} | {ours / crop:.2f}x | {ours / layout:.2f}x '
                  f'| {full_crop:.2f} | {full_crop / ours:.2f}x | {ms["full"] / ours:.2f}x |')
    print(f'| full decode alone | | | | {ms["full"]:.2f} | | | | | | | |')
