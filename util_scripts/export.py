"""Export a trained checkpoint for use outside the framework.

python -m util_scripts.export CHECKPOINT --output model.onnx
    [--format onnx|torchscript|exported_program] [--weights raw|ema] [--atol 1e-4] [--rtol 2e-6]
python -m util_scripts.export CHECKPOINT --output model_int8.onnx --quantize int8
    --calibration ANNOTATION [--calibration_clips 256] [--video_path DIR|URL] [--storage_options JSON]
    [--min_agreement 0.98] [--threads N]

onnx: torch.onnx.export with the dynamo exporter; torchscript: torch.jit.trace
(torch marks TorchScript deprecated: prefer the others); exported_program:
torch.export, saved with torch.export.save (.pt2). The input is one batch of
normalized clips, float32 (batch, channels, sample_duration, sample_size,
sample_size), the batch axis dynamic; the output the logits (batch,
n_classes). The class names and the input settings (mean, std, value scale,
sample size and duration, temporal stride) are stored with the model: ONNX
metadata_props "class_names" and "input" (JSON strings), the other formats an
extra file "metadata.json" holding both. Every export is checked on the spot
against the PyTorch model on random clips of two batch sizes (the largest
absolute difference of the logits is printed); the file is written only if it
is within --atol + --rtol x the largest logit: float32 rounding grows with the
logits (1.07e-4 on an untrained network's logits in the hundreds), while a
trained network's logits of a few units keep the bound near 1e-4.

--quantize int8 writes the checked ONNX graph statically quantized to int8
(utils/onnx_int8.py: QDQ, uint8 activations, per-channel int8 weights),
calibrated on --calibration_clips clips of the annotation's training videos
read as the model expects them (util_scripts/export_clips.py), from the
folder --video_path (default: the checkpoint's) or from the shards
util_scripts.make_shards wrote there (a folder with its index.json, an
http(s):// or s3:// URL, read as training reads them). It prints the
int8 file's top-1 agreement with the fp32 graph on the clips of the
annotation's validation videos, the video accuracy of both, and their time per
clip at batch 1 in onnxruntime; under --min_agreement nothing is written.

predict.py classifies videos with an exported .onnx file (fp32 or int8) as with the checkpoint.
As a command it parses its arguments before torch is imported (-h answers at once).
"""
# ruff: noqa: E402 -- the imports after the command-line parse are meant to be there
import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from utils.atomic import atomic_path
from utils.cli import Parser
from utils.urls import video_location

FORMATS = {'onnx': '.onnx', 'torchscript': '.pt', 'exported_program': '.pt2'}


def parse_args(argv):
    p = Parser(
        prog='python -m util_scripts.export',
        description='Export a checkpoint to ONNX, TorchScript or a torch.export program, '
                    'checked against the PyTorch model.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('checkpoint', type=Path, metavar='CHECKPOINT',
                   help='save_<epoch>.pth written by main.py')
    p.add_argument('--output', type=Path, required=True,
                   help='file to write (.onnx, .pt, .pt2)')
    p.add_argument('--format', choices=list(FORMATS), default=None,
                   help='default: from --output\'s suffix (.onnx, .pt, .pt2)')
    p.add_argument('--weights', choices=['raw', 'ema'], default='raw',
                   help='the trained weights, or their EMA (runs with --ema_decay)')
    p.add_argument('--atol', type=float, default=1e-4,
                   help='largest absolute difference of the logits accepted by the check, '
                   'plus --rtol times the largest absolute logit')
    p.add_argument('--rtol', type=float, default=2e-6,
                   help='the share of the largest absolute logit added to --atol')
    _add_int8_options(p.add_argument_group('int8 (--quantize int8, an .onnx --output)'))
    args = p.parse_args(argv)
    fmt = args.format
    if fmt is None:
        by_suffix = {suffix: name for name, suffix in FORMATS.items()}
        if args.output.suffix not in by_suffix:
            p.error(f'--output {args.output}: give --format, or a .onnx, .pt or .pt2 file')
        fmt = by_suffix[args.output.suffix]
    _check_int8_options(p, args, fmt)
    return args, fmt


def _add_int8_options(g):
    g.add_argument('--quantize', choices=['int8'], default=None,
                   help='write the ONNX graph statically quantized to int8 (calibrated on '
                        '--calibration\'s training videos, compared with fp32 on its validation videos)')
    g.add_argument('--calibration', type=Path, default=None, metavar='ANNOTATION',
                   help='annotation file (training and validation videos) of the int8 calibration '
                        'and comparison, e.g. the one the checkpoint was trained on')
    g.add_argument('--calibration_clips', type=int, default=256,
                   help='calibration clips, spread over the training videos')
    g.add_argument('--video_path', type=video_location, default=None,
                   help='folder of the annotation\'s videos (default: the checkpoint\'s --video_path; '
                        'read as its --file_type), or the shards util_scripts.make_shards wrote: their '
                        'folder, an http(s):// or s3://bucket/prefix URL')
    g.add_argument('--storage_options', default=None, metavar='JSON',
                   help='shards at a URL: JSON object of fsspec options (e.g. {"endpoint_url": ...}), '
                        'never credentials (without --video_path: the checkpoint\'s)%(default).0s')
    g.add_argument('--min_agreement', type=float, default=0.98,
                   help='the share of validation clips whose int8 top-1 must equal fp32\'s, else '
                        'nothing is written')
    g.add_argument('--threads', type=int, default=0,
                   help='onnxruntime threads of the time per clip (0: one per core of this process)')


def _check_int8_options(p, args, fmt):
    if args.quantize is None:
        if args.calibration is not None:
            p.error('--calibration is for --quantize int8')
        return
    if fmt != 'onnx':
        p.error(f'--quantize int8 writes ONNX: give an .onnx --output (not {args.output})')
    if args.calibration is None:
        p.error('--quantize int8 needs --calibration ANNOTATION (its training videos calibrate, '
                'its validation videos compare)')
    if args.calibration_clips < 1 or not 0 <= args.min_agreement <= 1 or args.threads < 0:
        p.error('--calibration_clips must be at least 1, --min_agreement within 0..1, '
                '--threads at least 0')


if __name__ == '__main__':
    COMMAND_LINE = parse_args(None)

import numpy as np
import torch

from checkpoint import load_trained_model
from opts import option_defaults
from utils.errors import USER_ERRORS
from utils.exported import INPUT_OPTIONS, OnnxClassifier

CHECK_BATCHES = (1, 3)  # batch sizes of the check (export traces batch 2)


def input_metadata(options):
    """The input settings: the options, and mean and std as the network sees
    them (pixel / 255 * value_scale, minus mean, divided by std)."""
    from datasets.spatial_transforms import get_mean_std
    mean, std = get_mean_std(options.value_scale, dataset=options.mean_dataset,
                             no_mean_norm=options.no_mean_norm, no_std_norm=options.no_std_norm)
    scale = options.value_scale
    return {
        'layout': 'NCTHW', 'dtype': 'float32',
        'shape': ['batch', *clip_shape(options)],
        'mean': [m * scale for m in mean], 'std': [s * scale for s in std],
        'pixel_scale': f'pixel / 255 * {scale}',
        **{name: getattr(options, name) for name in INPUT_OPTIONS},
    }


def clip_shape(options):
    """(channels, time, height, width) of one clip."""
    channels = 2 if options.input_type == 'flow' else 3
    return (channels, options.sample_duration, options.sample_size, options.sample_size)


def metadata(options, class_names, checkpoint):
    return {'class_names': json.dumps(list(class_names)),
            'input': json.dumps(input_metadata(options)),
            'arch': options.arch,
            'source': str(checkpoint)}


def _example(options, batch, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *clip_shape(options), generator=generator)


def _batch_dim():
    return torch.export.Dim('batch', min=1, max=65536)


def export_onnx(model, example, path, meta):
    program = torch.onnx.export(model, (example,), dynamo=True, input_names=['clips'],
                                output_names=['logits'], dynamic_shapes=({0: _batch_dim()},),
                                verbose=False)
    program.model.metadata_props.update(meta)
    program.save(str(path), external_data=False)  # one file (protobuf: up to 2 GB)


def export_torchscript(model, example, path, meta):
    with warnings.catch_warnings():  # torch marks TorchScript deprecated; it was asked for
        warnings.simplefilter('ignore', FutureWarning)
        traced = torch.jit.trace(model, example)
        torch.jit.save(traced, str(path), _extra_files={'metadata.json': json.dumps(meta)})


def export_program(model, example, path, meta):
    program = torch.export.export(model, (example,), dynamic_shapes=({0: _batch_dim()},))
    torch.export.save(program, str(path), extra_files={'metadata.json': json.dumps(meta)})


EXPORTERS = {'onnx': export_onnx, 'torchscript': export_torchscript,
             'exported_program': export_program}


def load_exported(path, fmt):
    """A callable clips -> logits (torch tensors) of an exported file."""
    if fmt == 'onnx':
        return OnnxClassifier(path)
    if fmt == 'torchscript':
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', FutureWarning)
            return torch.jit.load(str(path)).eval()
    return torch.export.load(str(path)).module()


@torch.no_grad()
def max_difference(model, exported, options):
    """(largest absolute difference of the logits, largest absolute logit of
    the PyTorch model) over random clips of CHECK_BATCHES sizes."""
    worst, largest = 0.0, 0.0
    for seed, batch in enumerate(CHECK_BATCHES):
        x = _example(options, batch, seed + 1)
        logits = model(x)
        worst = max(worst, (exported(x).float() - logits).abs().max().item())
        largest = max(largest, logits.abs().max().item())
    return worst, largest


def allowed_difference(largest_logit, atol=1e-4, rtol=2e-6):
    """What the check accepts: atol + rtol x the largest absolute logit."""
    return atol + rtol * largest_logit


def write_checked(model, options, meta, path, fmt, atol=1e-4, rtol=2e-6):
    """Exports ``model`` to ``path`` and checks the file against it: (seconds
    the export took, largest difference of the check). Past the bound it
    raises SystemExit; the caller removes ``path``."""
    start = time.perf_counter()
    with torch.no_grad():
        EXPORTERS[fmt](model, _example(options, 2, 0), path, meta)
    seconds = time.perf_counter() - start
    difference, largest = max_difference(model, load_exported(path, fmt), options)
    allowed = allowed_difference(largest, atol, rtol)
    if not difference <= allowed:
        raise SystemExit(f'error: the {fmt} export differs from the PyTorch model by '
                         f'{difference:.3g}, more than the {allowed:.3g} allowed (--atol '
                         f'{atol:g} + --rtol {rtol:g} x the largest logit, {largest:.3g}): '
                         f'not written')
    return seconds, difference


def describe(options, class_names):
    """The network and its input, as the export lines print them."""
    shape = 'x'.join(str(d) for d in clip_shape(options))
    return (f'{options.arch}, {len(class_names)} classes, '
            f'input (batch, {shape}) float32')


def export(checkpoint, output, fmt, weights='raw', atol=1e-4, rtol=2e-6):
    """Writes the export and returns the largest difference of its check."""
    model, options, class_names = load_trained_model(checkpoint, option_defaults(), weights=weights)
    meta = metadata(options, class_names, checkpoint)
    with atomic_path(output, keep_suffix=True) as tmp:  # torch.export wants .pt2
        seconds, difference = write_checked(model, options, meta, tmp, fmt, atol, rtol)
    print(f'{output}: {fmt}, {describe(options, class_names)}, exported in {seconds:.1f} s; '
          f'largest difference from PyTorch {difference:.2g} (batches of '
          f'{", ".join(map(str, CHECK_BATCHES))})')
    return difference


@dataclass
class Int8Report:
    """What export --quantize int8 measured (the seconds: per clip, batch 1)."""
    agreement: float  # share of the validation clips whose int8 top-1 is fp32's
    n_clips: int
    fp32_accuracy: float | None  # validation video accuracy
    int8_accuracy: float | None
    difference: float  # of the fp32 graph from PyTorch
    fp32_seconds: float = None
    int8_seconds: float = None
    threads: int = None


def compare_int8(fp32, int8, held_out, options, difference):
    """An Int8Report of the two files on the held-out clips (without the timing)."""
    from utils.onnx_int8 import onnx_logits, top1_agreement, video_accuracy
    owners = []  # the video of each clip, noted as the batches go by
    fp32_logits, int8_logits = onnx_logits([fp32, int8], _noting_videos(held_out.batches(options), owners))
    owners = np.concatenate(owners)
    return Int8Report(top1_agreement(int8_logits, fp32_logits), len(owners),
                      video_accuracy(fp32_logits, owners, held_out.labels),
                      video_accuracy(int8_logits, owners, held_out.labels), difference)


def _noting_videos(batches, owners):
    for clips, videos in batches:
        owners.append(videos)
        yield clips


def _percent(share):
    return 'n/a (no labels)' if share is None else f'{share:.1%}'


def refusal(report, args):
    agreeing = round(report.agreement * report.n_clips)
    return (f'error: the int8 top-1 agrees with fp32 on {report.agreement:.1%} of the validation '
            f'clips ({agreeing}/{report.n_clips}, {args.calibration}), under --min_agreement '
            f'{args.min_agreement:.1%}: not written (video accuracy fp32 '
            f'{_percent(report.fp32_accuracy)}, int8 {_percent(report.int8_accuracy)})')


def export_int8(args):
    """Writes args.output: the checkpoint's ONNX graph, checked against PyTorch,
    quantized to int8 on --calibration's training clips, if its top-1 agrees
    with the fp32 graph's on --min_agreement of the validation clips."""
    from util_scripts import export_clips
    from utils.onnx_int8 import quantize_onnx_int8
    model, options, class_names = load_trained_model(args.checkpoint, option_defaults(),
                                                     weights=args.weights)
    root = export_clips.video_root(args.video_path, options, args.checkpoint, args.storage_options)
    calibration = export_clips.calibration_set(args.calibration, root, options, args.calibration_clips)
    held_out = export_clips.validation_set(args.calibration, root, options, class_names)
    meta = metadata(options, class_names, args.checkpoint)
    with tempfile.TemporaryDirectory(prefix=f'.{args.output.stem}.', dir=args.output.parent) as folder, \
            atomic_path(args.output, keep_suffix=True) as int8:
        fp32 = Path(folder) / 'fp32.onnx'
        export_seconds, difference = write_checked(model, options, meta, fp32, 'onnx', args.atol,
                                                   args.rtol)
        start = time.perf_counter()
        quantize_onnx_int8(fp32, int8, (clips for clips, _ in calibration.batches(options)))
        seconds = (export_seconds, time.perf_counter() - start)
        report = compare_int8(fp32, int8, held_out, options, difference)
        if report.agreement < args.min_agreement:
            raise SystemExit(refusal(report, args))
        clip = next(held_out.batches(options))[0][:1]
        report.threads = args.threads or _cores()
        report.fp32_seconds, report.int8_seconds = time_both(fp32, int8, clip, report.threads)
        sizes = (fp32.stat().st_size, int8.stat().st_size)
    print_int8_report(report, args, options, class_names, (calibration, held_out), seconds, sizes)
    return report


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def time_both(fp32, int8, clip, threads, rounds=2):
    """(fp32, int8) seconds per clip: the lower of ``rounds`` alternating
    measurements of each, so that a load that comes and goes on the machine
    weighs on both alike."""
    from utils.onnx_int8 import time_onnx_per_clip
    times = [[time_onnx_per_clip(path, clip, threads) for path in (fp32, int8)] for _ in range(rounds)]
    return min(t[0] for t in times), min(t[1] for t in times)


def print_int8_report(report, args, options, class_names, clip_sets, seconds, sizes):
    calibration, held_out = clip_sets
    print(f'{args.output}: onnx int8 (QDQ, uint8 activations, int8 weights per channel), '
          f'{describe(options, class_names)}; the fp32 graph exported in {seconds[0]:.1f} s, '
          f'largest difference from PyTorch {report.difference:.2g} (batches of '
          f'{", ".join(map(str, CHECK_BATCHES))}); quantized in {seconds[1]:.1f} s, calibrated on '
          f'{calibration.n_clips} clips of {len(calibration.records)} training videos')
    agreeing = round(report.agreement * report.n_clips)
    print(f'top-1 agreement with fp32: {report.agreement:.1%} ({agreeing}/{report.n_clips} clips of '
          f'{len(held_out.records)} validation videos; --min_agreement {args.min_agreement:.1%}); '
          f'validation video accuracy: fp32 {_percent(report.fp32_accuracy)}, int8 '
          f'{_percent(report.int8_accuracy)}')
    ratio = report.fp32_seconds / report.int8_seconds
    verdict = (f'int8 is {ratio:.2f}x as fast' if ratio > 1 else
               f'int8 is NOT faster on this CPU: it takes {1 / ratio:.2f}x the fp32 time (for speed '
               f'deploy the fp32 file)')
    print(f'time per clip at batch 1, onnxruntime on {report.threads} thread(s): fp32 '
          f'{1e3 * report.fp32_seconds:.1f} ms, int8 {1e3 * report.int8_seconds:.1f} ms: {verdict}; '
          f'file size fp32 {sizes[0] / 1e6:.2f} MB, int8 {sizes[1] / 1e6:.2f} MB')


def main(argv=None, command_line=None):
    """command_line: parse_args's result (else parsed from argv)."""
    args, fmt = command_line or parse_args(argv)
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        if args.quantize == 'int8':
            return export_int8(args)
        return export(args.checkpoint, args.output, fmt, args.weights, args.atol, args.rtol)
    except USER_ERRORS as e:
        print(f'error: {e}', file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == '__main__':
    main(command_line=COMMAND_LINE)
