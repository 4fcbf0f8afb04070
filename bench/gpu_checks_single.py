"""The GPU self-check's checks on one GPU (bench/gpu_check.py runs each in a
process of its own). QUICK_CHECKS: the GPU-only paths no GPU has run yet;
CHECKS: the rest."""
import json
import math
import os
import re
import signal
import sys
import time

import torch

from bench.gpu_checks_common import (
    MAIN,
    ROOT,
    Check,
    Failed,
    Sampler,
    Skip,
    capability,
    count_graph_breaks,
    finish,
    finite_losses,
    json_results,
    last_rate,
    load_state,
    losses_text,
    max_weight_diff,
    ok,
    read_log,
    tail,
    train_losses,
    utilisation,
    wait_for,
)
from utils.processes import child_pids, end_tree

DOWN_SCALE = 1024.0  # the GradScaler scale written into a checkpoint to see it restored


def big_model_args(checker):
    """R3D-18 on 16x112x112 clips on a GPU; the small default on a CPU dry run."""
    if checker.cpu:
        return []
    return ['--model_depth', '18', '--resnet_widen_factor', '1', '--sample_size', '112',
            '--sample_duration', '16', '--n_threads', '8']


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


def check_fp16_recipe(c):
    """fp16 with --clip_grad_norm (unscaled before clipping), mixup and cutmix,
    and gradient accumulation: the losses stay finite, the scale is sane."""
    result = c.result_path('fp16_recipe')
    n = c.epochs(4, on_cpu=2)  # on CPU (no GradScaler) every step's recipe runs in 2 epochs as in 4
    ok(c.main_py(result, '--n_epochs', n, *c.amp_args('fp16'), '--clip_grad_norm', '1.0',
                 '--mixup_alpha', '0.8', '--cutmix_alpha', '1.0', '--accumulation_steps', '2'),
       'training')
    losses = finite_losses(result)
    scaler = load_state(result / f'save_{n}.pth')['scaler']
    if c.cpu:
        return f'losses {losses_text(losses)} (CPU: --amp is off, no GradScaler)'
    scale = scaler.get('scale')
    if scale is None or not math.isfinite(scale) or scale <= 0:
        raise Failed(f'GradScaler scale {scale} after {n} epochs (losses {losses_text(losses)})')
    return f'losses {losses_text(losses)}, GradScaler scale {scale:g} after {n} epochs'


def check_fp16_midepoch_resume(c):
    """A mid-epoch fp16 checkpoint whose scale is set to 1024 is resumed: the
    resumed epoch ends at that scale (or below it), not at a fresh scaler's
    65536 (its growth interval, 2000 steps, is far away)."""
    first = c.result_path('fp16_first')
    fp16 = c.amp_args('fp16')
    ok(c.main_py(first, '--n_epochs', '1', '--no_val', '--checkpoint_steps', '4', *fp16),
       'first run')
    state = load_state(first / 'save_1_4.pth')
    resumed = c.result_path('fp16_resumed')
    resumed.mkdir(parents=True)
    if state['scaler']:
        state['scaler']['scale'] = DOWN_SCALE
    torch.save(state, resumed / 'start.pth')
    ok(c.main_py(resumed, '--n_epochs', '1', '--no_val', '--resume_path',
                 str(resumed / 'start.pth'), *fp16), 'resumed run')
    end = load_state(resumed / 'save_1.pth')['scaler']
    if c.cpu:
        return 'CPU: --amp is off, no GradScaler state; the resume ran (plumbing only)'
    uninterrupted = load_state(first / 'save_1.pth')['scaler'].get('scale')
    if end.get('scale') is None or end['scale'] > DOWN_SCALE:
        raise Failed(f'the resumed epoch ended at scale {end.get("scale")}: the checkpoint\'s '
                     f'{DOWN_SCALE:g} was not restored (uninterrupted: {uninterrupted})')
    return (f'scale {DOWN_SCALE:g} in the checkpoint, {end["scale"]:g} at the end of the resumed '
            f'epoch (uninterrupted run: {uninterrupted:g})')


def check_normalize_on_device(c):
    """--normalize_on_device on (uint8 pinned, copied non_blocking, normalized
    into channels_last_3d on the device) against off: the first epoch's loss
    is equal within 2e-3 (both --deterministic)."""
    losses = {}
    for mode in ('on', 'off'):
        result = c.result_path(f'normalize_{mode}')
        ok(c.main_py(result, '--n_epochs', '1', '--no_val', '--deterministic', '--channels_last',
                     '--normalize_on_device', mode), f'--normalize_on_device {mode}')
        losses[mode] = train_losses(result)[0]
    a, b = losses['on'], losses['off']
    if not (math.isfinite(a) and abs(a - b) <= 2e-3 * max(1.0, abs(b))):
        raise Failed(f'first epoch loss {a:.6f} normalized on the device, {b:.6f} in the workers')
    return f'first epoch loss {a:.6f} on the device vs {b:.6f} in the workers ({abs(a - b):.1e})'


def check_three_crop_inference(c):
    """--inference_crop three on the device: 2 clips x 3 crops = 6 views per video."""
    result = c.result_path('three_crop')
    out = ok(c.main_py(result, '--no_train', '--resume_path', str(c.trained_checkpoint()),
                       '--inference', '--inference_crop', 'three', '--inference_n_clips', '2'),
             'inference')
    m = re.search(r'\((\d+) videos, ([\d/]+) views each\)', out)
    if not m or m.group(2) != '6':
        raise Failed(f'expected 6 views per video: {out.strip()[-300:]}')
    top1 = re.search(r'top-1 video accuracy on \w+: ([\d.]+)', out)
    return f'{m.group(1)} videos, 6 views each, top-1 {top1.group(1) if top1 else "?"}'


def check_deterministic_midepoch_resume(c):
    """--deterministic: resumed from a mid-epoch checkpoint, the epoch ends at the
    uninterrupted run's weights exactly."""
    whole = c.result_path('whole')
    ok(c.main_py(whole, '--n_epochs', '1', '--no_val', '--deterministic', '--checkpoint_steps',
                 '5'), 'uninterrupted run')
    resumed = c.result_path('resumed')
    ok(c.main_py(resumed, '--n_epochs', '1', '--no_val', '--deterministic', '--resume_path',
                 str(whole / 'save_1_5.pth')), 'resumed run')
    diff = max_weight_diff(whole / 'save_1.pth', resumed / 'save_1.pth')
    if diff != 0:
        raise Failed(f'resumed after 5 steps: weights differ by up to {diff:.3g}')
    return 'resumed after 5 steps: weights equal to the uninterrupted run (max diff 0)'


def check_predict_cuda(c):
    """predict.py on the GPU scores the test videos as on the CPU (within 1e-3)."""
    ckpt = str(c.trained_checkpoint())
    videos = str(c.data / 'jpg' / 'test')
    scores = {}
    for device in ('cuda', 'cpu'):
        extra = ['--no_cuda'] if device == 'cpu' else []
        out = ok(c.run([sys.executable, str(ROOT / 'predict.py'), ckpt, videos, '--json',
                        '--n_clips', '2', '--n_threads', '2', *extra], 600), f'predict.py {device}')
        scores[device] = json.loads(out[out.index('{"results"'):].splitlines()[0])['results']
    diff, n = 0.0, len(scores['cpu'])
    for vid, entries in scores['cpu'].items():
        gpu = {e['label']: e['score'] for e in scores['cuda'][vid]}
        if gpu.keys() != {e['label'] for e in entries} or \
                scores['cuda'][vid][0]['label'] != entries[0]['label']:
            raise Failed(f'{vid}: labels {list(gpu)} on the GPU, {[e["label"] for e in entries]} on CPU')
        diff = max([diff] + [abs(gpu[e['label']] - e['score']) for e in entries])
    if diff > 1e-3:
        raise Failed(f'scores differ by up to {diff:.2e} between the GPU and the CPU')
    where = 'CPU (dry run)' if c.cpu else 'the GPU'
    return f'{n} videos on {where}, top-1 labels equal, max |score - CPU score| {diff:.1e}'


def check_bf16_below_sm80(c):
    """--amp_dtype bf16 below compute capability 8.0 is refused in one line."""
    if c.cpu:
        raise Skip('needs a GPU; tests/test_errors.py fakes a V100 on CPU')
    if capability() >= (8, 0):
        raise Skip(f'compute capability {capability()} runs bf16; the refusal below 8.0 is '
                   f'tested with a faked V100 (tests/test_errors.py)')
    proc = c.main_py(c.result_path('bf16'), *c.amp_args('bf16'), '--n_epochs', '1')
    err = proc.stderr.strip()
    if proc.returncode != 2 or len(err.splitlines()) != 1 or 'capability 8.0' not in err:
        raise Failed(f'exit {proc.returncode}, stderr: {err[-400:]}')
    return err


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
    model = ['--model', 'resnet-18', '--sample_size', '112', '--sample_duration', '16',
             '--batch_size', '32', '--steps', '10'] if not c.cpu else \
        ['--model', 'resnet-10', '--sample_size', '32', '--sample_duration', '8',
         '--batch_size', '8', '--steps', '3']
    out = ok(c.run([sys.executable, '-m', 'bench.train_throughput', *model, '--device',
                    'cpu' if c.cpu else 'cuda', '--configs', 'amp'], 600), 'bench.train_throughput')
    m = re.search(r'^\| amp \| ([\d.]+) \|', out, re.MULTILINE)
    if not m:
        raise Failed(f'bench.train_throughput: {out.strip()[-300:]}')
    return float(m.group(1))


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
    from datasets.device_jpeg import CpuJpeg, device_jpeg_decoder
    from datasets.loader import DeferredBatch
    from utils.device_batches import BatchDecoder
    from utils.distributed import DistContext
    opt = main.parse_opts(args)
    record, _ = main.prepare(opt, DistContext())
    val_set, _ = data.get_validation_data(opt, dataclasses.replace(record, decode_on_device=True))
    items = DeferredBatch(val_set[i][0] for i in range(min(8, len(val_set))))
    device = device_jpeg_decoder(torch.device('cpu' if c.cpu else 'cuda', 0))
    gpu = BatchDecoder(val_set.spatial_transform, device)(items)
    cpu = BatchDecoder(val_set.spatial_transform, CpuJpeg())(items)
    return (gpu.cpu().int() - cpu.int()).abs().float().mean().item(), device.name


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


# ----------------------------------------------------------------------------- the rest

def check_amp(c, dtype):
    """10 epochs: past the 3 warmup epochs, the loss falls."""
    result = c.result_path(f'amp_{dtype}')
    proc = ok(c.main_py(result, '--n_epochs', c.epochs(10, on_cpu=2), *c.amp_args(dtype)),
              'training')
    losses = finite_losses(result)
    if losses[-1] >= losses[0] and not c.cpu:  # a dry run's 2 epochs of 48 clips: plumbing
        raise Failed(f'train losses {losses}: not decreasing')
    return f'losses {losses_text(losses)}, {last_rate(result)[0]:.0f} clips/s' + \
        (f' ({proc.count("Traceback")} tracebacks)' if 'Traceback' in proc else '')


def check_channels_last(c):
    result = c.result_path('channels_last')
    epochs = ['--n_epochs', '1'] if c.cpu else []  # args()' 3 on a GPU; on CPU the figures are not read
    ok(c.main_py(result, '--channels_last', *c.amp_args('bf16'), *epochs), 'training with --channels_last')
    losses = finite_losses(result)
    return f'losses {losses_text(losses)}, {last_rate(result)[0]:.0f} clips/s'


def check_device_normalisation(c):
    from datasets.spatial_transforms import NormalizeToInput
    device = torch.device('cpu' if c.cpu else 'cuda')
    norm = NormalizeToInput([0.43, 0.40, 0.37], [0.23, 0.22, 0.22], value_scale=1)
    clips = torch.randint(0, 256, (4, 16, 3, 112, 112), dtype=torch.uint8)
    expected = norm(clips)
    got = norm(clips.to(device)).cpu()
    diff = (got - expected).abs().max().item()
    if got.shape != expected.shape or diff > 1e-5:
        raise Failed(f'shape {tuple(got.shape)} vs {tuple(expected.shape)}, max diff {diff:.2e}')
    return f'max |device - cpu| {diff:.2e} on {tuple(expected.shape)}'


def check_memory_flat(c):
    """Peak memory of a 2-epoch run and of a 6-epoch run, in this process (one
    CUDA context): equal when nothing accumulates from epoch to epoch."""
    if c.cpu:
        raise Skip('GPU memory')
    import gc

    import main
    peaks = []
    for n_epochs in (2, 6):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        main.main(c.args(c.result_path(f'memory_{n_epochs}'), '--n_epochs', str(n_epochs),
                         '--n_threads', '0'))
        peaks.append(torch.cuda.max_memory_allocated() / 2**20)
    gc.collect()
    retained = torch.cuda.memory_allocated() / 2**20
    if peaks[1] > peaks[0] * 1.05 + 16:
        raise Failed(f'peak {peaks[0]:.0f} MiB after 2 epochs, {peaks[1]:.0f} MiB after 6')
    return f'peak {peaks[0]:.0f} MiB (2 epochs), {peaks[1]:.0f} MiB (6 epochs), ' \
           f'{retained:.0f} MiB still allocated after both runs'


def check_resume_under_fp16(c):
    result = c.result_path('resume_fp16')
    ok(c.main_py(result, '--n_epochs', '1', *c.amp_args('bf16')), 'first epoch')
    out = ok(c.main_py(result, '--n_epochs', '2', '--resume_path', str(result / 'save_1.pth'),
                       *c.amp_args('fp16')), 'resume under fp16')
    if 'epoch 2/2 train' not in out:
        raise Failed('the resumed run did not train epoch 2')
    return 'bf16 checkpoint resumed with --amp --amp_dtype fp16'


def check_torchrun_one_process(c):
    result = c.result_path('torchrun_1')
    extra = ['--batchnorm_sync', '--amp', '--inference', '--auto_resume']
    ok(c.torchrun(1, result, *extra, '--n_epochs', '1'), 'first run')
    out = ok(c.torchrun(1, result, *extra, '--n_epochs', '2'), 'resumed run')
    if 'auto-resume from' not in out or not (result / 'val.json').exists():
        raise Failed(f'no auto-resume or no val.json: {out[-400:]}')
    return f'trained 1 + 1 epochs, {len(json_results(result / "val.json"))} videos scored'


def check_elastic_restart(c):
    """torchrun --max-restarts 1: the worker SIGKILLed after epoch 1 is restarted
    and the job resumes and finishes (processes found through /proc)."""
    result = c.result_path('elastic')
    # On CPU 3 epochs: the kill still lands in epoch 2, 2 epochs before the end
    cmd = c.torchrun_cmd(1, result, '--n_epochs', c.epochs(6, on_cpu=3), '--auto_resume',
                         launcher=['--max-restarts=1'])
    proc = c.popen(cmd)
    try:
        wait_for(lambda: (result / 'save_1.pth').exists(), proc, 'save_1.pth', 240)
        workers = child_pids(proc.pid)
        if not workers:
            raise Failed('torchrun has no worker process')
        t_kill = time.time()
        os.kill(workers[0], signal.SIGKILL)
        out, err, in_time = finish(proc, 300)
    finally:
        end_tree(proc, 0)  # torchrun's workers run in sessions of their own
    if not in_time:
        raise Failed(f'the job did not finish within 300 s of the kill: {(out + err)[-400:]}')
    if proc.returncode != 0 or 'auto-resume from' not in out + err:
        raise Failed(f'exit {proc.returncode}: {(out + err)[-400:]}')
    return f'worker killed after epoch 1, job finished {time.time() - t_kill:.0f} s later'


def check_stop_signal(c):
    """SIGTERM mid-epoch: a checkpoint, exit code 75, and the same command
    continues from it."""
    from utils.preemption import EXIT_PREEMPTED
    result = c.result_path('stop_signal')
    cmd = [sys.executable, MAIN, *c.args(result, '--n_epochs', '2', '--auto_resume',
                                          '--checkpoint_steps', '1', '--batch_size', '4')]
    proc = c.popen(cmd)
    try:
        wait_for(lambda: (result / 'save_1_2.pth').exists(), proc, 'a mid-epoch checkpoint', 240)
        proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        out, err, in_time = finish(proc, 120)
        stopped = time.time() - t0
    finally:
        end_tree(proc, 0)
    if not in_time:
        raise Failed(f'still running 120 s after SIGTERM: {(out + err)[-400:]}')
    if proc.returncode != EXIT_PREEMPTED:
        raise Failed(f'exit {proc.returncode} (expected {EXIT_PREEMPTED}): {(out + err)[-400:]}')
    out = ok(c.run(cmd, 300), 'resumed run')
    if 'auto-resume from' not in out or not (result / 'save_2.pth').exists():
        raise Failed(f'the resumed run did not finish: {out[-400:]}')
    return f'exit {EXIT_PREEMPTED} {stopped:.1f} s after SIGTERM; resumed and finished'


def check_deterministic_repeat(c):
    """Two identical 1-epoch runs: with --deterministic the weights must be
    equal; without it, the difference is printed (a figure, not a failure)."""
    diffs = {}
    for flag in ([], ['--deterministic']):
        runs = [c.result_path('repeat') for _ in range(2)]
        if c.cpu and not flag:  # the shared checkpoint is this very command's: one run fewer on CPU
            runs[0] = c.trained_checkpoint().parent
        for result in runs:
            if not (result / 'save_1.pth').exists():
                ok(c.main_py(result, '--n_epochs', '1', '--no_val', *flag), 'training')
        diffs[bool(flag)] = max_weight_diff(runs[0] / 'save_1.pth', runs[1] / 'save_1.pth')
    if diffs[True] != 0:
        raise Failed(f'--deterministic runs differ by up to {diffs[True]:.3g}')
    return f'max weight difference of two runs: {diffs[False]:.3g} by default, 0 with --deterministic'


def check_test_suite(c):
    proc = c.run([sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider'], 3600,
                 env=c.env(OMP_NUM_THREADS='2'))
    summary = (proc.stdout.strip().splitlines() or [''])[-1]
    if proc.returncode != 0:
        raise Failed(f'{summary}: {tail(proc)}')
    return summary


QUICK_CHECKS = {
    'fp16_recipe': Check(check_fp16_recipe, 60, 'fp16 with --clip_grad_norm, mixup/cutmix and '
                         '--accumulation_steps 2: finite losses, a sane GradScaler scale', quick=True),
    'fp16_midepoch_resume': Check(check_fp16_midepoch_resume, 60, 'a mid-epoch fp16 checkpoint '
                                  'resumes with its GradScaler scale', quick=True),
    'normalize_on_device': Check(check_normalize_on_device, 60, '--normalize_on_device on vs off '
                                 '(pinned uint8, non_blocking, channels_last_3d): equal loss', quick=True),
    'deterministic_midepoch_resume': Check(check_deterministic_midepoch_resume, 60, 'a mid-epoch '
                                           'resume with --deterministic: equal weights', quick=True),
    'three_crop_inference': Check(check_three_crop_inference, 60, 'three-crop inference on the '
                                  'device: 6 views per video', quick=True),
    'predict_cuda': Check(check_predict_cuda, 45, 'predict.py on CUDA scores as on CPU', quick=True),
    'bf16_below_sm80': Check(check_bf16_below_sm80, 30, '--amp_dtype bf16 refused in one line '
                             'below compute capability 8.0', quick=True),
    'ema_cost': Check(check_ema_cost, 60, 'clips/s of the step with and without --ema_decay '
                      '(FAIL when the update costs over 2%)', quick=True),
    'gpu_utilisation': Check(check_gpu_utilisation, 150, 'GPU utilisation of R3D-18 16x112x112 '
                             'with 16 workers; data path vs model clips/s', quick=True),
    'compile_1gpu': Check(check_compile_1gpu, 240, '--compile trains; graph breaks; speed vs '
                          'eager', quick=True),
}

CHECKS = {
    'amp_bf16': Check(lambda c: check_amp(c, 'bf16'), 90, '--amp bf16 trains, the loss falls'),
    'amp_fp16': Check(lambda c: check_amp(c, 'fp16'), 90, '--amp fp16 (GradScaler) trains'),
    'channels_last': Check(check_channels_last, 60, '--channels_last trains'),
    'device_normalisation': Check(check_device_normalisation, 30, 'normalisation on the device '
                                  'equals the CPU\'s'),
    'memory_flat': Check(check_memory_flat, 90, 'GPU memory flat from 2 to 6 epochs'),
    'resume_under_fp16': Check(check_resume_under_fp16, 60, 'a bf16 checkpoint resumes under fp16'),
    'torchrun_1_process': Check(check_torchrun_one_process, 90, 'torchrun with --batchnorm_sync '
                                '--amp --inference --auto_resume'),
    'elastic_restart': Check(check_elastic_restart, 120, 'a killed worker is restarted and resumes'),
    'gpu_decoding': Check(check_gpu_decoding, 120, '--decode_device cuda: GPU decoding equals '
                          'simplejpeg within 2/255; clips/s vs the workers; GPU utilisation'),
    'stop_signal': Check(check_stop_signal, 90, 'SIGTERM mid-epoch: checkpoint, exit 75, resume'),
    'deterministic_repeat': Check(check_deterministic_repeat, 120, 'two --deterministic runs: '
                                  'equal weights'),
}
TEST_SUITE = {'test_suite': Check(check_test_suite, 1800, 'the test suite (CPU)')}
