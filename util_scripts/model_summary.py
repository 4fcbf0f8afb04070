"""Markdown table of parameters, GFLOPs per clip and (optionally) the
forward+backward time of the networks.

    python -m util_scripts.model_summary --models resnet-18 resnet2p1d-18 r3d_18 \
        --sample_size 112 --sample_duration 16 --time

Model names are `<family>-<depth>` (families: resnet, resnet2p1d, preresnet,
wideresnet, resnext, densenet; predecessor's default options), `x3d-<size>`
(xs, s, m, l: measure each at its own clip, e.g. --sample_duration 4
--sample_size 160 for x3d-xs) or a torchvision video model name (r3d_18,
mc3_18, r2plus1d_18, s3d, mvit_v2_s, swin3d_t). GFLOPs count a multiply-add
as 2 FLOPs (see utils/flops.py): twice the "GFLOPS" that torchvision publishes.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn

import model as model_builder
from models import torchvision_video
from models.x3d_sizes import X3D_CLIPS
from opts import build_parser
from utils.cli import Parser
from utils.flops import count_gflops, count_parameters

DEFAULT_MODELS = [
    'resnet-10', 'resnet-18', 'resnet-34', 'resnet-50', 'resnet-101', 'resnet-152', 'resnet-200',
    'resnet2p1d-18', 'resnet2p1d-34', 'resnet2p1d-50',
    'preresnet-50', 'wideresnet-50', 'resnext-101', 'densenet-121',
    'r3d_18', 'mc3_18', 'r2plus1d_18',
]


def build(name: str, n_classes: int, n_input_channels: int) -> nn.Module:
    """The network main.py builds for --model/--model_depth, with the other
    model options at their defaults."""
    opt = build_parser().parse_args([])
    family, _, depth = name.rpartition('-')
    if name in torchvision_video.TORCHVISION_MODELS:
        opt.model = name
    elif family == 'x3d':
        if depth not in X3D_CLIPS:
            raise SystemExit(f'unknown model {name!r}: X3D sizes are {", ".join(f"x3d-{s}" for s in X3D_CLIPS)}')
        opt.model, opt.x3d_size = family, depth
    else:
        if not depth.isdigit():
            raise SystemExit(f'unknown model {name!r}: use <family>-<depth>, x3d-<size> or one of '
                             f'{torchvision_video.TORCHVISION_MODELS}')
        opt.model, opt.model_depth = family, int(depth)
    opt.n_input_channels = n_input_channels
    try:
        return model_builder.generate_model(opt, n_classes=n_classes)
    except ValueError as e:
        raise SystemExit(f'unknown model {name!r}: {e}')


def time_fwd_bwd(model: nn.Module, clip_shape: tuple, repeats: int) -> float:
    """Median milliseconds of one training step's forward + backward, batch 1."""
    model.train()
    x = torch.randn((1,) + clip_shape)
    times = []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        model(x).sum().backward()
        if i > 0:  # the first pass warms up allocator and kernels
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', default=DEFAULT_MODELS)
    parser.add_argument('--sample_size', type=int, default=112)
    parser.add_argument('--sample_duration', type=int, default=16)
    parser.add_argument('--n_classes', type=int, default=400)
    parser.add_argument('--n_input_channels', type=int, default=3)
    parser.add_argument('--time', action='store_true', help='also time forward+backward (batch 1, CPU)')
    parser.add_argument('--repeats', type=int, default=3, help='timed passes per model (after one warm-up)')
    args = parser.parse_args(argv)

    clip_shape = (args.n_input_channels, args.sample_duration, args.sample_size, args.sample_size)
    header = ['model', 'params (M)', 'GFLOPs/clip']
    if args.time:
        header.append('fwd+bwd (ms)')
    print(f'Input clip {"x".join(map(str, clip_shape))}, {args.n_classes} classes; '
          'GFLOPs count a multiply-add as 2.\n')
    print('| ' + ' | '.join(header) + ' |')
    print('|' + '|'.join(['---'] + ['---:'] * (len(header) - 1)) + '|')
    for name in args.models:
        if args.time:
            model = build(name, args.n_classes, args.n_input_channels)
        else:
            # Counting needs shapes only: a meta model is built without allocating or initialising weights.
            with torch.device('meta'):
                model = build(name, args.n_classes, args.n_input_channels)
        row = [name, f'{count_parameters(model) / 1e6:.2f}', f'{count_gflops(model, clip_shape):.2f}']
        if args.time:
            row.append(f'{time_fwd_bwd(model, clip_shape, args.repeats):.0f}')
        print('| ' + ' | '.join(row) + ' |', flush=True)
    if args.time:
        print(f'\nTimes on {torch.get_num_threads()} CPU threads, torch {torch.__version__}.')


if __name__ == '__main__':
    main()
