"""The GPU self-check's speed checks on one GPU (util_scripts/gpu_check.py runs
each in a process of its own): --compile against eager, the EMA update's
cost, GPU utilisation and the data path against the model, and JPEG decoding
on the device."""
import json
import re
import sys
import time

import torch

from util_scripts.gpu_checks.common import (
    MAIN,
    Failed,
    Sampler,
    count_graph_breaks,
    finish,
    finite_losses,
    last_rate,
    losses_text,
    new_registry,
    ok,
    read_log,
    tail,
    utilisation,
    wait_for,
)
from utils.processes import end_tree

CHECKS, check = new_registry()  # {name: Check} in the order defined, and @check


def ema_step_rates(c, reps=3, steps=10):
    """(clips/s without, with update_ema after every step), best of reps."""
    from util_scripts.model_summary import build
    from utils.ema import make_ema, update_ema
    from utils.precision import amp_dtype
    device = torch.device('cpu' if c.cpu else 'cuda')
    torch.backends.cudnn.benchmark = True
    name, shape = ('resnet-10', (4, 3, 8, 32, 32)) if c.cpu else ('resnet-18', (16, 3, 16, 112, 112))
    model = build(name, 400, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    clips, labels = torch.randn(shape, device=device), torch.randint(400, (shape[0],), device=device)
    ema = make_ema(model, 0.999)

    def run(with_ema):
        if device.type == 'cuda':
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            with torch.autocast(device.type, dtype=amp_dtype(device), enabled=not c.cpu):
                loss = torch.nn.functional.cross_entropy(model(clips).float(), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if with_ema:
                update_ema(ema, model)
        if device.type == 'cuda':
            torch.cuda.synchronize()
        return steps * shape[0] / (time.perf_counter() - t0)
    run(False), run(True)  # warm-up: cudnn.benchmark's search
    rates = {False: [], True: []}
    for _ in range(reps):
        for with_ema in (False, True):
            rates[with_ema].append(run(with_ema))
    return max(rates[False]), max(rates[True]), name, shape


@check(60, 'clips/s of the step with and without --ema_decay (FAIL when the update costs '
       'over 2%)', quick=True)
def check_ema_cost(c):
    """Clips/s of the training step without and with the EMA update after it
    (utils/ema.py, as --ema_decay runs it): an update that costs over 2% of
    the step's speed is a FAIL."""
    plain, with_ema, name, shape = ema_step_rates(c, steps=3 if c.cpu else 20)
    cost = 1 - with_ema / plain
    text = (f'{name} batch {shape[0]}x{shape[2]}x{shape[3]}: {plain:.1f} clips/s without EMA, '
            f'{with_ema:.1f} with --ema_decay ({cost:+.1%})')
    if not c.cpu and cost > 0.02:
        raise Failed(text + ': the EMA update costs over 2% of the step')
    return text


def utilisation_data(c):
    """A training set of 240x240 JPEG frames (UCF-101's are 320x240): 60 rendered
    videos, each listed 16 times through symbolic links (960 videos; 48 on CPU)."""
    from datasets.synthetic import prepare_synthetic
    root = c.work / 'data_240'
    video_path, annotation_path = prepare_synthetic(
        root, seed=1, n_train_per_class=10 if not c.cpu else 2, n_val_per_class=1, n_test=1,
        n_frames=16, frame_size=240 if not c.cpu else 64)
    big = root / 'annotation_x16.json'
    with c.shared('data_240'):  # gpu_utilisation and gpu_decoding may run at once on CPU
        if not big.exists():
            write_x16(root, annotation_path, big)
    return video_path, str(big)


def write_x16(root, annotation_path, big):
    """The annotation with each training video listed 16 times, the copies
    symbolic links to it."""
    annotation = json.loads(open(annotation_path).read())
    for vid, entry in list(annotation['database'].items()):
        if entry['subset'] != 'training':
            continue
        label = entry['annotations']['label']
        for k in range(1, 16):
            link = root / 'jpg' / label / f'{vid}_copy{k}'
            if not link.exists():
                link.symlink_to(vid)
            annotation['database'][f'{vid}_copy{k}'] = entry
    big.write_text(json.dumps(annotation))


def utilisation_args(c, result):
    video_path, annotation_path = utilisation_data(c)
    size = ['--model_depth', '18', '--sample_size', '112', '--sample_duration', '16',
            '--batch_size', '32', '--n_threads', '16'] if not c.cpu else \
        ['--model_depth', '10', '--resnet_widen_factor', '0.25', '--sample_size', '32',
         '--sample_duration', '8', '--batch_size', '8', '--n_threads', '2']
    return ['--dataset', 'ucf101', '--video_path', video_path, '--annotation_path',
            annotation_path, '--n_classes', '6', '--model', 'resnet', *size, '--amp',
            '--normalize_on_device', 'on', '--learning_rate', '0.01', '--no_val',
            '--no_progress', '--n_epochs', c.epochs(4, on_cpu=2), '--checkpoint', '4',
            '--result_path', str(result)]


def data_path_rate(args):
    """Clips/s of the training loader alone (main.py's, same options), after its
    first batch (the workers' start)."""
    import dataset as data
    import main
    from utils.distributed import DistContext
    from utils.resumable_data import start_epoch
    opt = main.parse_opts(args)
    opt.result_path.mkdir(parents=True, exist_ok=True)
    ctx = DistContext()
    record, _ = main.prepare(opt, ctx)
    train_set, _ = data.get_training_data(opt, record)
    loader = data.make_train_loader(train_set, opt, ctx)
    data.seed_worker_rngs(0)
    start_epoch(loader.loader, 1)  # the DataLoader inside the DeviceLoader
    batches = iter(loader)
    next(batches)
    t0, clips = time.perf_counter(), 0
    for clips_batch, _ in batches:
        clips += len(clips_batch)
    return clips / (time.perf_counter() - t0)


def model_rate(c):
    """Clips/s of the training step alone (bench.train_throughput, amp)."""
    # On CPU amp is bf16, 50 times slower than fp32 without bf16 instructions (AVX2): a
    # dry run times one step of 2 clips (batch 8, 3 steps: 100 s of the check's 114).
    model = ['--model', 'resnet-18', '--sample_size', '112', '--sample_duration', '16',
             '--batch_size', '32', '--steps', '10'] if not c.cpu else \
        ['--model', 'resnet-10', '--sample_size', '32', '--sample_duration', '8',
         '--batch_size', '2', '--steps', '1', '--warmup', '1']
    out = ok(c.run([sys.executable, '-m', 'bench.train_throughput', *model, '--device',
                    'cpu' if c.cpu else 'cuda', '--configs', 'amp'], 600), 'bench.train_throughput')
    m = re.search(r'^\| amp \| ([\d.]+) \|', out, re.MULTILINE)
    if not m:
        raise Failed(f'bench.train_throughput: {out.strip()[-300:]}')
    return float(m.group(1))


@check(150, 'GPU utilisation of R3D-18 16x112x112 with 16 workers; data path vs model '
       'clips/s', quick=True)
def check_gpu_utilisation(c):
    """Training R3D-18 16x112x112 (amp, batch 32, 16 workers) on 240x240 JPEG
    frames: GPU utilisation over epochs 2-4, and the data path's clips/s
    against the model's (which one limits training)."""
    result = c.result_path('utilisation')
    args = utilisation_args(c, result)
    proc = c.popen([sys.executable, MAIN, *args])
    try:
        with Sampler(utilisation) as sampler:
            wait_for(lambda: (result / 'train.log').exists() and len(read_log(result / 'train.log')) >= 1,
                     proc, 'the first epoch', 900)
            sampler.active.set()  # epochs 2-4: the workers' start each epoch included
            out, err, in_time = finish(proc, 900)
    finally:
        end_tree(proc, 0)  # after a failure above: the training and its workers
    if not in_time:
        raise Failed(f'training ran past 900 s: {(out + err).strip()[-400:]}')
    if proc.returncode != 0:
        raise Failed(f'training exited {proc.returncode}: {(out + err).strip()[-400:]}')
    rate, wait = last_rate(result)
    samples = [s[0] for s in sampler.samples]
    util = f'GPU utilisation {sum(samples) / len(samples):.0f}% (mean of {len(samples)} samples)' \
        if samples else 'GPU utilisation not readable (no pynvml, no nvidia-smi)' if not c.cpu \
        else 'no GPU (dry run)'
    loader = data_path_rate(args[:-1] + [str(c.result_path('data_path'))])
    step = model_rate(c)
    limit = 'the data path' if loader < step else 'the model'
    return (f'{util}; main.py {rate:.3g} clips/s, data wait {wait:.0%}; data path alone '
            f'{loader:.3g} clips/s ({args[args.index("--n_threads") + 1]} workers), model step '
            f'alone {step:.3g} clips/s: {limit} limits training')


DECODE_BOUND = 2.0  # mean |GPU - CPU| of 255: nvjpeg's IDCT and upsampling vs libjpeg-turbo's


def decoding_loader(c, args, on_device):
    """The training loader of main.py's options `args`, its frames decoded in
    the workers or (on_device) by the device's JPEG decoder in this process
    (on a CPU dry run: simplejpeg here, the same path)."""
    import dataclasses

    import dataset as data
    import main
    from utils.distributed import DistContext
    from utils.resumable_data import start_epoch
    opt = main.parse_opts(args)
    opt.result_path.mkdir(parents=True, exist_ok=True)
    ctx = DistContext(device=torch.device('cpu' if c.cpu else 'cuda', 0))
    record, _ = main.prepare(opt, DistContext())  # the devices' choice is made below
    record = dataclasses.replace(record, decode_on_device=on_device, normalize_on_device=True)
    train_set, _ = data.get_training_data(opt, record)
    loader = data.make_train_loader(train_set, opt, ctx)
    data.seed_worker_rngs(0)
    start_epoch(loader.loader, 1)
    return loader


def loader_rate(loader, sampler=None):
    """Clips/s after the first batch (the workers' start), the device synchronized."""
    batches = iter(loader)
    next(batches)
    if sampler is not None:
        sampler.active.set()
    t0, clips = time.perf_counter(), 0
    for x, _ in batches:
        clips += len(x)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return clips / (time.perf_counter() - t0)


def decoded_difference(c, args):
    """Mean absolute difference (of 255) between the device decoder's uint8
    clips and simplejpeg's at the DCT reduction, on validation items (centre
    crops: no random steps), and the decoder's name."""
    import dataclasses

    import dataset as data
    import main
    from datasets.device_batches import BatchDecoder
    from datasets.device_jpeg import CpuJpeg, device_jpeg_decoder
    from datasets.loader import DeferredBatch
    from utils.distributed import DistContext
    opt = main.parse_opts(args)
    record, _ = main.prepare(opt, DistContext())
    val_set, _ = data.get_validation_data(opt, dataclasses.replace(record, decode_on_device=True))
    items = DeferredBatch(val_set[i][0] for i in range(min(8, len(val_set))))
    device = device_jpeg_decoder(torch.device('cpu' if c.cpu else 'cuda', 0))
    gpu = BatchDecoder(val_set.spatial_transform, device)(items)
    cpu = BatchDecoder(val_set.spatial_transform, CpuJpeg())(items)
    return (gpu.cpu().int() - cpu.int()).abs().float().mean().item(), device.name


@check(120, '--decode_device cuda: GPU decoding equals simplejpeg within 2/255; clips/s vs '
       'the workers; GPU utilisation')
def check_gpu_decoding(c):
    """--decode_device cuda: the GPU decoder's clips equal simplejpeg's within
    the decoders' rounding (mean |diff| <= 2 of 255), the training loader's
    clips/s with decoding on the GPU against the workers' (16 workers, 240x240
    JPEG frames), the GPU's utilisation meanwhile, and main.py trains with it
    (on a CPU dry run: the same path with simplejpeg in the main process, and
    main.py's refusal without a GPU)."""
    result = c.result_path('decode')
    args = utilisation_args(c, result)
    diff, name = decoded_difference(c, args)
    if diff > DECODE_BOUND:
        raise Failed(f'{name} differs from simplejpeg by {diff:.2f} of 255 on average '
                     f'(bound {DECODE_BOUND})')
    rates = {}
    with Sampler(utilisation) as sampler:
        rates['device'] = loader_rate(decoding_loader(c, args, True), sampler)
        sampler.active.clear()
    rates['workers'] = loader_rate(decoding_loader(c, args, False))
    samples = [s[0] for s in sampler.samples]
    util = f'GPU utilisation {sum(samples) / len(samples):.0f}% while decoding' if samples \
        else 'no GPU utilisation (dry run)' if c.cpu else 'GPU utilisation not readable'
    trained_path = c.result_path('decode_train')
    run = c.main_py(trained_path, '--n_epochs', '1', '--no_val', '--decode_device', 'cuda')
    if c.cpu:
        if run.returncode == 0 or '--decode_device cuda needs a CUDA GPU' not in run.stderr:
            raise Failed(f'main.py --decode_device cuda on CPU was not refused: {tail(run)}')
        trained = 'main.py refuses --decode_device cuda without a GPU'
    else:
        ok(run, 'main.py --decode_device cuda')
        trained = f'main.py trains with it (loss {losses_text(finite_losses(trained_path))})'
    return (f'{name}: mean |diff| {diff:.3f} of 255 vs simplejpeg; training loader '
            f'{rates["device"]:.3g} clips/s decoding on the device vs {rates["workers"]:.3g} in '
            f'{args[args.index("--n_threads") + 1]} workers; {util}; {trained}')


@check(240, '--compile trains; graph breaks; speed vs eager', quick=True)
def check_compile_1gpu(c):
    """--compile through main.py: it trains, graph breaks counted; the step's
    speed against eager from bench.train_throughput (R3D-18 16x112, fp32)."""
    runs = {}
    for mode in ('eager', 'compile'):
        result = c.result_path(mode)
        flag = ['--compile'] if mode == 'compile' else []
        proc = ok(c.main_py(result, '--n_epochs', c.epochs(2, on_cpu=1), '--no_val', *flag,
                            env=c.env(TORCH_LOGS='graph_breaks')), f'{mode} training')
        finite_losses(result)
        runs[mode] = (last_rate(result)[0], count_graph_breaks(proc))
    first = re.search(r'first training step took ([\d.]+) s', proc)
    model = ['--model', 'resnet-10', '--sample_size', '32', '--sample_duration', '8',
             '--batch_size', '4', '--steps', '3'] if c.cpu else \
        ['--model', 'resnet-18', '--sample_size', '112', '--sample_duration', '16',
         '--batch_size', '16', '--steps', '10']
    bench = ok(c.run([sys.executable, '-m', 'bench.train_throughput', *model, '--device',
                      'cpu' if c.cpu else 'cuda', '--configs', 'fp32', 'compile'], 1200),
               'bench.train_throughput')
    rates = dict(re.findall(r'^\| (fp32|compile) \| ([\d.]+) \|', bench, re.MULTILINE))
    if set(rates) != {'fp32', 'compile'}:
        raise Failed(f'bench.train_throughput: {bench.strip()[-300:]}')
    step = float(rates['compile']) / float(rates['fp32'])
    return (f'main.py --compile: {runs["compile"][1]} graph breaks, first step '
            f'{first.group(1) if first else "?"} s, last epoch at {runs["compile"][0]:.0f} clips/s '
            f'(eager {runs["eager"][0]:.0f}); training step {" ".join(model[1:2])}: compiled '
            f'{float(rates["compile"]):.1f} clips/s vs eager {float(rates["fp32"]):.1f} '
            f'({step:.2f}x)')
