"""Export a trained checkpoint for use outside the framework.

python -m util_scripts.export CHECKPOINT --output model.onnx
    [--format onnx|torchscript|exported_program] [--weights raw|ema] [--atol 1e-4] [--rtol 2e-6]

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

predict.py classifies videos with an exported .onnx file as with the checkpoint.
As a command it parses its arguments before torch is imported (-h answers at once).
"""
# ruff: noqa: E402 -- the imports after the command-line parse are meant to be there
import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

from utils.cli import Parser

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
    args = p.parse_args(argv)
    fmt = args.format
    if fmt is None:
        by_suffix = {suffix: name for name, suffix in FORMATS.items()}
        if args.output.suffix not in by_suffix:
            p.error(f'--output {args.output}: give --format, or a .onnx, .pt or .pt2 file')
        fmt = by_suffix[args.output.suffix]
    return args, fmt


if __name__ == '__main__':
    COMMAND_LINE = parse_args(None)

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
            'arch': f'{options.model}-{options.model_depth}',
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


def export(checkpoint, output, fmt, weights='raw', atol=1e-4, rtol=2e-6):
    """Writes the export and returns the largest difference of its check."""
    model, options, class_names = load_trained_model(checkpoint, option_defaults(), weights=weights)
    meta = metadata(options, class_names, checkpoint)
    tmp = output.with_name(f'.{output.stem}.tmp{output.suffix}')  # torch.export wants .pt2
    start = time.perf_counter()
    with torch.no_grad():
        EXPORTERS[fmt](model, _example(options, 2, 0), tmp, meta)
    seconds = time.perf_counter() - start
    try:
        difference, largest = max_difference(model, load_exported(tmp, fmt), options)
        allowed = allowed_difference(largest, atol, rtol)
        if not difference <= allowed:
            raise SystemExit(f'error: the {fmt} export differs from the PyTorch model by '
                             f'{difference:.3g}, more than the {allowed:.3g} allowed (--atol '
                             f'{atol:g} + --rtol {rtol:g} x the largest logit, {largest:.3g}): '
                             f'not written')
        os.replace(tmp, output)
    finally:
        if tmp.exists():
            tmp.unlink()
    shape = 'x'.join(str(d) for d in clip_shape(options))
    print(f'{output}: {fmt}, {options.model}-{options.model_depth}, {len(class_names)} classes, '
          f'input (batch, {shape}) float32, exported in {seconds:.1f} s; largest difference '
          f'from PyTorch {difference:.2g} (batches of {", ".join(map(str, CHECK_BATCHES))})')
    return difference


def main(argv=None, command_line=None):
    """command_line: parse_args's result (else parsed from argv)."""
    args, fmt = command_line or parse_args(argv)
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        return export(args.checkpoint, args.output, fmt, args.weights, args.atol, args.rtol)
    except USER_ERRORS as e:
        print(f'error: {e}', file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == '__main__':
    main(command_line=COMMAND_LINE)
