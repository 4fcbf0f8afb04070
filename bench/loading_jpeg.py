"""bench/data_loading.py's jpeg section: today's JPEG path (torchvision's full-size
decode and augmentation) against ours (simplejpeg at the scale the planned crop
needs) on jpg and hdf5 frames, the same for video files (RGB conversion at full
size against the plan's scale), and simplejpeg's DCT scaling per frame."""
import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.io import decode_jpeg
from torchvision.transforms import v2

from bench import loading_timing as timing
from bench.loading_formats import video_limit
from bench.loading_timing import OUTPUTS, best_of_rounds, planned_clip
from datasets.loader import Hdf5ClipLoader, JpgClipLoader
from datasets.spatial_transforms import KeepUint8, build_eval_transform, build_train_transform, get_mean_std
from datasets.video import VideoClipLoader
from datasets.video_index import FrameTable


def todays_decode(data):
    """The data path before simplejpeg: torchvision's batched decode_jpeg of the
    clip's frames at full size, stacked channels-last (datasets/loader.py until then)."""
    frames = decode_jpeg([torch.from_numpy(d) if isinstance(d, np.ndarray)  # hdf5 elements
                          else torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data])
    return torch.stack([f.permute(1, 2, 0) for f in frames]).permute(0, 3, 1, 2)


def todays_finish(mean, std, output):
    """The last step before contiguous_clip (datasets/spatial_transforms.py until
    then): 'float', NormalizeToInput's permuting float copy of the channels-last
    clip; 'uint8' (normalized on the device), KeepUint8's ``Tensor.contiguous``."""
    gain = torch.tensor([1 / 255 / s for s in std]).view(3, 1, 1, 1)
    bias = torch.tensor([m / s for m, s in zip(mean, std)]).view(3, 1, 1, 1)
    if output == 'uint8':
        return lambda clip: clip.as_subclass(torch.Tensor).contiguous()
    return lambda clip: clip.as_subclass(torch.Tensor).movedim(-3, -4).to(
        torch.float32, memory_format=torch.contiguous_format).mul_(gain).sub_(bias)


def todays_transforms(size, mean, std, output='float'):
    """The v2 pipelines before the crop was planned: full-size clips in, the
    crop/resize as the pipeline's first step, today's finish (``output``: 'float'
    normalized in the worker, 'uint8' for normalization on the device)."""
    finish = todays_finish(mean, std, output)
    train = v2.Compose([v2.RandomResizedCrop(size, scale=(0.25, 1.0), ratio=(0.75, 1 / 0.75),
                                             antialias=True), v2.RandomHorizontalFlip(0.5)])
    val = v2.Compose([v2.Resize(size, antialias=True), v2.CenterCrop(size)])
    return {name: (lambda clip, t=t: finish(t(tv_tensors.Video(clip))))
            for name, t in (('train', train), ('val', val))}


def jpeg_rows(paths, n_clips, n_frames, rounds=5):
    """{row: clips/s}: today's JPEG path (torchvision decode at full size + full-size
    augmentation) against ours (simplejpeg, decoded at the plan's scale), for
    training and evaluation transforms, jpg and hdf5, and the full-frame decode limits."""
    mean, std = get_mean_std(1)
    ours = {'train': build_train_transform(112, mean=mean, std=std),
            'val': build_eval_transform(112, mean=mean, std=std)}
    finish = {'float': None, 'uint8': KeepUint8(ours['val'].finish)}
    jpg, hdf5 = JpgClipLoader(), Hdf5ClipLoader()

    def bytes_of(loader, path, positions):
        return loader.read(str(path), positions).planes[0]

    def sj_full(loader, path, positions):
        return loader.read(str(path), positions).decode(1)
    runs = {}
    for fmt, loader in (('jpg', jpg), ('hdf5', hdf5)):
        for output in OUTPUTS:
            today = todays_transforms(112, mean, std, output)
            for kind in ('train', 'val'):
                runs[f'{fmt}_{kind}_{output}_today'] = (
                    lambda p, pos, ld=loader, t=today[kind]: t(todays_decode(bytes_of(ld, p, pos))),
                    fmt)
                runs[f'{fmt}_{kind}_{output}_ours'] = (
                    lambda p, pos, ld=loader, t=ours[kind], f=finish[output]: planned_clip(
                        ld, t, p, pos, f), fmt)
        runs[f'{fmt}_limit_tv'] = (lambda p, pos, ld=loader: todays_decode(bytes_of(ld, p, pos)),
                                   fmt)
        runs[f'{fmt}_limit_sj'] = (lambda p, pos, ld=loader: sj_full(ld, p, pos), fmt)
    return best_of_rounds(runs, paths, n_clips, n_frames, rounds)


def print_jpeg_table(rates, n_videos, n_frames, quality, frame_kb):
    print(f'\nJPEG frames (jpg folders, hdf5), {n_videos} videos of {n_frames} frames, 320x240, '
          f'JPEG quality {quality} ({frame_kb:.1f} kB a frame); 16-frame clips -> '
          f'3x16x112x112, one process, one thread (clips/s). today: '
          f'torchvision decode_jpeg at full size + full-size augmentation; ours: simplejpeg '
          f'at the scale the crop needs. train: random resized crop + flip; val: short side '
          f'to 112 + center crop. limits: read + decode the 16 full frames')
    print('output: float = normalized in the worker (CPU runs); uint8 = normalized on the '
          'device (GPU runs, --normalize_on_device auto)')
    print('| format | transform | output | today | ours | ours / today '
          '| ours / limit (torchvision) | ours / limit (simplejpeg) |')
    print('|---|---|---|---:|---:|---:|---:|---:|')
    for fmt in ('jpg', 'hdf5'):
        tv, sj = rates[f'{fmt}_limit_tv'], rates[f'{fmt}_limit_sj']
        for kind in ('train', 'val'):
            for output in OUTPUTS:
                a, b = rates[f'{fmt}_{kind}_{output}_today'], rates[f'{fmt}_{kind}_{output}_ours']
                print(f'| {fmt} | {kind} | {output} | {a:.1f} | {b:.1f} | {b / a:.2f}x '
                      f'| {b / tv:.2f}x | {b / sj:.2f}x |')
        print(f'| {fmt} | limit: decode 16 full frames | | {tv:.1f} (torchvision) | {sj:.1f} '
              f'(simplejpeg) | {sj / tv:.2f}x | | |')


def video_scale_rows(paths, n_clips, n_frames, rounds=5):
    """{row: clips/s}: video files (a fresh open per clip, the stored frame index),
    today's path (training: every frame converted to RGB at full size, then the
    full-size augmentation; evaluation: converted at the short side 112 by FFmpeg's
    scaler, the eval loader's short_side) against ours (the crop planned from the
    first frame's size, the frames converted at the plan's reduction), and the limit
    (plain PyAV: open, seek, decode, convert the 16 frames at full size)."""
    mean, std = get_mean_std(1)
    transforms = {'train': build_train_transform(112, mean=mean, std=std),
                  'val': build_eval_transform(112, mean=mean, std=std)}
    today = todays_finish(mean, std, 'float')
    table = FrameTable(None)
    loaders = {'today_train': VideoClipLoader(threads=1, frame_table=table),
               'today_val': VideoClipLoader(short_side=112, threads=1, frame_table=table),
               'ours': VideoClipLoader(threads=1, frame_table=table)}

    def fresh(name, fn):
        def clip(path, positions):
            try:
                return fn(loaders[name], path, positions)
            finally:
                loaders[name].close()  # a fresh open per clip, as over many videos
        return clip
    runs = {}
    for fmt in ('mp4_g16', 'avi'):
        for kind, t in transforms.items():
            runs[f'{fmt}_{kind}_today'] = (fresh(f'today_{kind}', lambda ld, p, pos, t=t: today(
                t.augment(ld(str(p), pos)))), fmt)
            runs[f'{fmt}_{kind}_ours'] = (fresh('ours', lambda ld, p, pos, t=t: planned_clip(
                ld, t, p, pos)), fmt)
        runs[f'{fmt}_limit'] = (video_limit, fmt)
    return best_of_rounds(runs, paths, n_clips, n_frames, rounds)


def print_video_scale_table(rates, n_videos, n_frames):
    print(f'\nvideo files, {n_videos} videos of {n_frames} frames, 320x240, a fresh open per '
          f'clip; 16-frame clips -> 3x16x112x112, one process, one thread (clips/s). today: '
          f'frames converted to RGB at full size (training) or at short side 112 (evaluation); '
          f'ours: converted at the scale the crop needs. limit: plain PyAV open + seek + '
          f'decode + convert the 16 full frames')
    print('| format | transform | today | ours | ours / today | ours / limit |')
    print('|---|---|---:|---:|---:|---:|')
    names = {'mp4_g16': 'H.264 .mp4, keyframe every 16', 'avi': 'MPEG-4 .avi'}
    for fmt in ('mp4_g16', 'avi'):
        limit = rates[f'{fmt}_limit']
        for kind in ('train', 'val'):
            a, b = rates[f'{fmt}_{kind}_today'], rates[f'{fmt}_{kind}_ours']
            print(f'| {names[fmt]} | {kind} | {a:.1f} | {b:.1f} | {b / a:.2f}x | '
                  f'{b / limit:.2f}x |')
        print(f'| {names[fmt]} | limit | {limit:.1f} | | | |')


def dct_scaling_costs(folder, n_frames: int = 48, rounds: int = 5) -> None:
    """simplejpeg's decode time per frame at 1/1, 1/2, 1/4, 1/8 (best of the rounds):
    how much DCT scaling can save on these frames (entropy decoding is not scaled)."""
    import simplejpeg
    data = [(folder / f'image_{p + 1:05d}.jpg').read_bytes() for p in range(n_frames)]
    height, width = simplejpeg.decode_jpeg_header(data[0])[:2]
    scales = {f: {} if f == 1 else dict(min_factor=f, min_height=-(-height // f),
                                         min_width=-(-width // f)) for f in (1, 2, 4, 8)}
    best = {f: [float('inf')] * len(data) for f in scales}
    for _ in range(rounds):  # each frame's fastest round, the factors interleaved
        for f, scale in scales.items():
            for i, d in enumerate(data):
                start = timing.clock()
                simplejpeg.decode_jpeg(d, **scale)
                best[f][i] = min(best[f][i], timing.clock() - start)
    cost = {f: sum(times) / len(times) * 1e3 for f, times in best.items()}
    print(f'\nsimplejpeg decode of a {width}x{height} frame (ms, vs full size): ' +
          ', '.join(f'1/{f} {ms:.3f} ({ms / cost[1]:.0%})' for f, ms in cost.items()))
