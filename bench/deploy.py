"""How fast a network classifies clips where it is deployed, on this machine's CPU:
time per clip at batch 1 and throughput at batch 8, for each runtime.

    python -m bench.deploy [--models resnet-18 resnet2p1d-18 x3d-xs x3d-s]
        [--runtimes eager compile onnx int8] [--threads N] [--repeats 5] [--json PATH]

Each network gets its own clip: x3d-<size> the paper's (XS 4x160, S 13x160,
M 16x224, L 16x312), the others 16x112 (--sample_duration / --sample_size
override both), 400 classes, untrained weights (speed does not depend on them).
Runtimes:
  eager    PyTorch, model.eval() under torch.inference_mode()
  compile  torch.compile (inductor) of the same; its compilation for the two
           batch sizes is timed apart and left out of the figures
  onnx     util_scripts.export's ONNX graph (dynamo exporter) in onnxruntime fp32
  int8     that graph statically quantized to int8 (QDQ, per-channel weights,
           utils.onnx_int8, as `util_scripts.export --quantize int8` writes it),
           calibrated here on random clips: the speed is what is measured;
           the export reports the accuracy on real clips
torch and onnxruntime run on --threads threads (default: every core; one
inter-op thread). Every figure is the median of --repeats runs after one
warm-up run; run it alone on the machine, other processes share the cores.
"""
import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from util_scripts.export import export_onnx
from util_scripts.model_summary import build
from utils.atomic import write_atomic
from utils.cli import Parser
from utils.onnx_int8 import onnx_session, quantize_onnx_int8

DEFAULT_MODELS = ('resnet-18', 'resnet2p1d-18', 'x3d-xs', 'x3d-s')
RUNTIMES = ('eager', 'compile', 'onnx', 'int8')
BATCHES = (1, 8)
N_CLASSES = 400


def clip_shape(name, sample_duration=None, sample_size=None):
    """(C, T, H, W) the network is run at: x3d its size's own clip, others 16x112."""
    duration, size = 16, 112
    if name.startswith('x3d-'):
        from models.x3d import X3D_CLIPS
        duration, size = X3D_CLIPS[name.removeprefix('x3d-')]
    return (3, sample_duration or duration, sample_size or size, sample_size or size)


def median_seconds(run, repeats):
    run()  # warm-up: allocator, kernels, onnxruntime's arenas
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_runner(model, clips):
    def run():
        with torch.inference_mode():
            model(clips)
    return run


def onnx_runner(session, clips):
    feed = {session.get_inputs()[0].name: clips.numpy()}
    return lambda: session.run(None, feed)


def compiled(model, inputs):
    """torch.compile of model, compiled for each input's shape; (module, seconds)."""
    module = torch.compile(model, dynamic=False)
    start = time.perf_counter()
    with torch.inference_mode():
        for clips in inputs.values():
            module(clips)
    return module, time.perf_counter() - start


def onnx_files(model, shape, folder, runtimes):
    """{'onnx': fp32 path, 'int8': int8 path} as asked, with the seconds they took."""
    paths, seconds = {}, {}
    start = time.perf_counter()
    fp32 = Path(folder) / 'model.onnx'
    with torch.no_grad():
        export_onnx(model, torch.randn(2, *shape), fp32, {})
    paths['onnx'], seconds['onnx'] = fp32, time.perf_counter() - start
    if 'int8' in runtimes:
        start = time.perf_counter()
        generator = torch.Generator().manual_seed(0)
        calibration = [torch.randn(1, *shape, generator=generator).numpy() for _ in range(8)]
        paths['int8'] = Path(folder) / 'model_int8.onnx'
        quantize_onnx_int8(fp32, paths['int8'], calibration)
        seconds['int8'] = time.perf_counter() - start
    return paths, seconds


def measure_model(name, runtimes, threads, repeats, shape):
    """Rows of one network: runtime, ms per clip at batch 1, clips/s at batch 8, set-up seconds."""
    model = build(name, N_CLASSES, 3).eval()
    generator = torch.Generator().manual_seed(0)
    inputs = {b: torch.randn(b, *shape, generator=generator) for b in BATCHES}
    rows = []

    def add(runtime, runners, setup_seconds=None):
        seconds = {b: median_seconds(runners[b], repeats) for b in BATCHES}
        rows.append(dict(model=name, clip='x'.join(map(str, shape[1:3])), runtime=runtime, threads=threads,
                         ms_per_clip_batch1=1e3 * seconds[1], clips_per_s_batch8=BATCHES[1] / seconds[8],
                         setup_s=setup_seconds))
        print(f'  {name} {runtime}: {rows[-1]["ms_per_clip_batch1"]:.1f} ms/clip, '
              f'{rows[-1]["clips_per_s_batch8"]:.2f} clips/s', flush=True)

    if 'eager' in runtimes:
        add('eager', {b: torch_runner(model, x) for b, x in inputs.items()})
    if 'compile' in runtimes:
        module, seconds = compiled(model, inputs)
        add('compile', {b: torch_runner(module, x) for b, x in inputs.items()}, seconds)
        del module
        torch._dynamo.reset()
    onnx_runtimes = [r for r in ('onnx', 'int8') if r in runtimes]
    if onnx_runtimes:
        with tempfile.TemporaryDirectory() as folder:
            paths, seconds = onnx_files(model, shape, folder, runtimes)
            for runtime in onnx_runtimes:
                session = onnx_session(paths[runtime], threads)
                add(runtime, {b: onnx_runner(session, x) for b, x in inputs.items()}, seconds[runtime])
                del session
    gc.collect()
    return rows


def table(rows):
    eager = {r['model']: r for r in rows if r['runtime'] == 'eager'}
    lines = ['| model | clip | runtime | threads | ms/clip, batch 1 | clips/s, batch 8 | vs eager '
             '(batch 1, batch 8) | set-up (s) |',
             '|---|---|---|---:|---:|---:|---:|---:|']
    for r in rows:
        base = eager.get(r['model'])
        ratio = '' if base is None else (f'{base["ms_per_clip_batch1"] / r["ms_per_clip_batch1"]:.2f}x, '
                                         f'{r["clips_per_s_batch8"] / base["clips_per_s_batch8"]:.2f}x')
        setup = '' if r['setup_s'] is None else f'{r["setup_s"]:.1f}'
        lines.append(f'| {r["model"]} | {r["clip"]} | {r["runtime"]} | {r["threads"]} | '
                     f'{r["ms_per_clip_batch1"]:.1f} | {r["clips_per_s_batch8"]:.2f} | {ratio} | {setup} |')
    return '\n'.join(lines)


def parse_args(argv):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', nargs='+', default=list(DEFAULT_MODELS),
                   help='util_scripts.model_summary names, and x3d-xs|s|m|l')
    p.add_argument('--runtimes', nargs='+', choices=RUNTIMES, default=list(RUNTIMES))
    p.add_argument('--threads', type=int, default=os.cpu_count())
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--sample_duration', type=int, default=None)
    p.add_argument('--sample_size', type=int, default=None)
    p.add_argument('--json', type=Path, default=None, help='also write the rows here')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    print(f'torch {torch.__version__}, {args.threads} threads of {os.cpu_count()} cores', flush=True)
    rows = []
    for name in args.models:
        rows += measure_model(name, args.runtimes, args.threads, args.repeats,
                              clip_shape(name, args.sample_duration, args.sample_size))
    return report(rows, table(rows), args.json)


def report(rows, text, json_path):
    """Prints a benchmark's table and writes its rows to json_path (--json) when given."""
    print(text)
    if json_path is not None:
        write_atomic(json_path, json.dumps(rows, indent=1))
    return rows


if __name__ == '__main__':
    main()
