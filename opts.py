"""Command-line options.

Every option of 3D-ResNets-PyTorch keeps its name, default and meaning, so
existing command lines and scripts run unchanged. New options are added at the
end of each group. Hyphenated spellings are accepted as aliases; options are
spelt out in full (no abbreviations). Standard library only: main.py parses
before it imports torch, so -h and option errors answer at once.
"""
import argparse
import json
import os
import sys
from pathlib import Path

from models.x3d_sizes import SIZES as X3D_SIZES
from utils.atomic import atomic_file
from utils.cli import Parser
from utils.urls import redact_url, redacted, storage_option_names, video_location

# Used when --dataset synthetic and the option was not given: a small network
# on tiny clips that learns the built-in data set in under a minute on 2 CPU cores.
SYNTHETIC_DEFAULTS = dict(
    sample_size=32,
    sample_duration=8,
    model_depth=10,
    resnet_widen_factor=0.5,
    no_hflip=True,  # a flip swaps move_left and move_right
    train_crop_min_scale=0.5,
    batch_size=16,
    learning_rate=0.1,
    nesterov=True,
    lr_scheduler='cosine',
    warmup_epochs=3.0,
    n_epochs=15,
    checkpoint=5,
    n_threads=2,
    inference=True,
    inference_stride=4,
)

# Used with --model x3d when the option was not given (not with --dataset synthetic,
# whose tiny clips win): the clip each X3D size was trained on and the frame stride
# of PyTorchVideo's Kinetics recipes for it (models/x3d_sizes.py: torch-free).
X3D_DEFAULTS = {name: dict(sample_duration=size.clip_length, sample_size=size.crop_size,
                           sample_t_stride=size.frame_stride) for name, size in X3D_SIZES.items()}


def _add(parser, name, **kwargs):
    """Adds --a_b with the alias --a-b."""
    flags = [name]
    if '_' in name:
        flags.append(name.replace('_', '-'))
    parser.add_argument(*flags, **kwargs)


def build_parser():
    p = Parser(
        description='Train and evaluate 3D CNNs for video action recognition.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    g = p.add_argument_group('paths')
    _add(g, '--root_path', default=None, type=Path,
         help='If set, prefixed to video_path, annotation_path, result_path, '
              'resume_path, pretrain_path and inflate_from')
    _add(g, '--video_path', default=None, type=video_location,
         help='Root of the frame folders (jpg), hdf5 or video files; or the shards util_scripts.make_shards '
              'wrote: their folder, an http(s):// or s3://bucket/prefix URL (docs/data.md)')
    _add(g, '--annotation_path', default=None, type=Path,
         help='Annotation JSON file')
    _add(g, '--result_path', default=None, type=Path,
         help='Output folder (created if missing)')
    _add(g, '--opts_file', default=None, type=Path,
         help='opts.json of an earlier run: every option as that run was given it, the '
              'command line on top (--resume_path, --auto_resume and --overwrite are not '
              'carried over)')
    _add(g, '--storage_options', default=None, type=str,
         help='JSON object of fsspec options for a --video_path URL, e.g. \'{"endpoint_url": '
              '"http://127.0.0.1:9000"}\' for an S3-compatible server; never credentials (S3: the AWS '
              'environment variables or ~/.aws; HTTP: user:password@ in the URL)')
    _add(g, '--shard_cache', default=None, type=Path,
         help='Folder that keeps the videos read from shards at a URL (each worker reads a video '
              'from it after its first epoch), at most --shard_cache_gb')
    _add(g, '--shard_cache_gb', default=10.0, type=float,
         help='Bound of --shard_cache in GB (least recently used videos removed first)')

    g = p.add_argument_group('data')
    _add(g, '--dataset', default='kinetics', type=str,
         choices=['kinetics', 'activitynet', 'ucf101', 'hmdb51', 'mit', 'synthetic'],
         help='Dataset layout; synthetic is generated locally (no download)')
    # '%(default).0s' prints nothing: it keeps argparse from appending "(default: None)".
    _add(g, '--n_classes', default=None, type=int,
         help='Number of classes (default: the annotation\'s label count; 3D-ResNets-PyTorch\'s '
              'default was 400). Given, it must equal that count%(default).0s')
    _add(g, '--n_pretrain_classes', default=0, type=int,
         help='Number of classes of the pretrained model (0: read from --pretrain_path)')
    _add(g, '--pretrain_path', default=None, type=Path,
         help='Pretrained model (.pth) to fine-tune from')
    _add(g, '--ft_begin_module', default='', type=str,
         help='First top-level module to fine-tune (e.g. layer4, fc); earlier '
              'modules are frozen. Empty: train everything')
    _add(g, '--sample_size', default=112, type=int, help='Height and width of inputs')
    _add(g, '--sample_duration', default=16, type=int, help='Temporal duration of inputs')
    _add(g, '--sample_t_stride', default=1, type=int,
         help='Temporal stride between sampled frames (train, val and inference)')
    _add(g, '--train_crop', default='random', type=str,
         choices=['random', 'corner', 'center'],
         help='Spatial crop in training: random (RandomResizedCrop), corner '
              '(multi-scale corner crop) or center')
    _add(g, '--train_crop_min_scale', default=0.25, type=float,
         help='Min area scale of RandomResizedCrop')
    _add(g, '--train_crop_min_ratio', default=0.75, type=float,
         help='Min aspect ratio of RandomResizedCrop')
    _add(g, '--no_hflip', action='store_true', help='Disable horizontal flip in training')
    _add(g, '--colorjitter', action='store_true', help='Colour jitter in training')
    _add(g, '--train_t_crop', default='random', type=str, choices=['random', 'center'],
         help='Temporal crop in training')
    _add(g, '--mean_dataset', default='kinetics', type=str,
         choices=['kinetics', 'activitynet', '0.5', 'imagenet'],
         help='Normalisation statistics (imagenet: those ImageNet weights, --inflate_from, expect)')
    _add(g, '--no_mean_norm', action='store_true', help='Do not subtract the mean')
    _add(g, '--no_std_norm', action='store_true', help='Do not divide by the std')
    _add(g, '--value_scale', default=1, type=int,
         help='Pixel value range: 1 for [0, 1], 255 for [0, 255]')
    _add(g, '--n_val_samples', default=3, type=int,
         help='Clips per video in validation, evenly spread')
    _add(g, '--file_type', default='jpg', type=str, choices=['jpg', 'hdf5', 'video'],
         help='Frame storage: jpg folders, hdf5 files, or the video files themselves '
              '(<video_path>/<label>/<video_id>.mp4/.avi/.webm/.mkv, decoded with PyAV)')
    _add(g, '--input_type', default='rgb', type=str, choices=['rgb', 'flow'],
         help='rgb (3 channels) or flow (2 channels, hdf5 only)')
    _add(g, '--accimage', action='store_true',
         help='Accepted for compatibility and ignored: frames are decoded with '
              'simplejpeg (libjpeg-turbo), a whole clip at once, at the scale the crop needs')
    _add(g, '--inflate_from', default=None, type=Path, metavar='PATH',
         help='Start a new run from a 2D ImageNet ResNet state dict (torchvision or timm; .pth, or '
              '.safetensors with the safetensors package): its kernels inflated over time (I3D), '
              'BatchNorm copied, the classifier new; --model resnet at the file\'s depth. Not with '
              '--pretrain_path; a resumed run takes the checkpoint\'s weights')

    g = p.add_argument_group('optimisation')
    _add(g, '--learning_rate', default=0.1, type=float,
         help='Initial learning rate (divided by 10 at each milestone)')
    _add(g, '--momentum', default=0.9, type=float, help='Momentum')
    _add(g, '--dampening', default=0.0, type=float, help='Dampening of SGD')
    _add(g, '--weight_decay', default=1e-3, type=float, help='Weight decay')
    _add(g, '--nesterov', action='store_true', help='Nesterov momentum')
    _add(g, '--optimizer', default='sgd', type=str, choices=['sgd', 'adamw'],
         help='Optimizer')
    _add(g, '--lr_scheduler', default='multistep', type=str,
         choices=['multistep', 'plateau', 'cosine'],
         help='multistep (x0.1 at milestones), plateau (on validation loss) or '
              'cosine (per iteration, after a linear warmup)')
    _add(g, '--multistep_milestones', default=[50, 100, 150], type=int, nargs='+',
         help='Epochs after which the learning rate is multiplied by 0.1')
    _add(g, '--overwrite_milestones', action='store_true',
         help='On resume, use the milestones given now, not the checkpoint\'s')
    _add(g, '--plateau_patience', default=10, type=int, help='Patience of ReduceLROnPlateau')
    _add(g, '--warmup_epochs', default=0.0, type=float,
         help='Linear learning-rate warmup (cosine schedule), in epochs')
    _add(g, '--min_lr', default=0.0, type=float, help='Final learning rate of the cosine schedule')
    _add(g, '--batch_size', default=128, type=int,
         help='Batch size (in distributed mode the global batch over all processes)')
    _add(g, '--inference_batch_size', default=0, type=int,
         help='Batch size for inference; 0 means batch_size')
    _add(g, '--n_epochs', default=200, type=int, help='Last epoch to train (epochs count from 1)')
    _add(g, '--accumulation_steps', default=1, type=int,
         help='Micro-batches whose gradients are accumulated before each optimizer step')
    _add(g, '--normalize_on_device', default='auto', choices=['auto', 'on', 'off'],
         help='Copy clips to the device as uint8 and convert/normalize there (4x fewer '
              'bytes to move); auto: on with GPUs')
    _add(g, '--decode_device', default='cpu', choices=['cpu', 'cuda'],
         help='Where JPEG frames (jpg, hdf5) are decoded: cpu (in the loader workers) or '
              'cuda (the workers read the bytes, the GPU decodes, crops, resizes and '
              'normalizes each batch: nvImageCodec, else torchvision\'s nvjpeg decoder)')
    _add(g, '--channels_last', action='store_true',
         help='Model and clips in channels_last_3d memory format (faster 3D '
              'convolutions on recent GPUs, mostly with --amp)')
    _add(g, '--amp', action='store_true',
         help='Mixed precision (bf16 autocast; fp16 with a GradScaler on GPUs without bf16)')
    _add(g, '--ft_lr_ratio', default=1.0, type=float,
         help='Fine-tuning: the pretrained (not frozen) layers train at this ratio of the '
              'learning rate, the classifier at the full rate (two parameter groups)')

    g = p.add_argument_group('run')
    _add(g, '--resume_path', default=None, type=Path,
         help='Checkpoint to resume training (or to evaluate) from')
    _add(g, '--auto_resume', action='store_true',
         help="Resume from the checkpoint this result_path's run wrote last (last_checkpoint.json), if any")
    _add(g, '--no_train', action='store_true', help='Skip training')
    _add(g, '--no_val', action='store_true', help='Skip validation')
    _add(g, '--inference', action='store_true', help='Run inference and write <subset>.json')
    _add(g, '--inference_subset', default='val', type=str, choices=['train', 'val', 'test'],
         help='Subset used for inference')
    _add(g, '--inference_stride', default=16, type=int, help='Sliding-window stride (frames)')
    _add(g, '--inference_crop', default='center', type=str, choices=['center', 'nocrop', 'three'],
         help='Spatial crop at inference; three: three crops along the long side')
    _add(g, '--inference_no_average', action='store_true',
         help='Write per-clip results instead of the video average')
    _add(g, '--output_topk', default=5, type=int, help='Top-k classes written by inference; <= 0: all')
    _add(g, '--no_cuda', action='store_true', help='Run on CPU even if a GPU is present')
    _add(g, '--n_threads', default=4, type=int, help='Data-loading worker processes (per process)')
    _add(g, '--threads', default=0, type=int,
         help='Intra-op threads of each training process; 0: the CPUs it may use (affinity, cgroup quota) '
              'shared among the ranks of the node, less one per data-loading worker (utils/threads.py)')
    _add(g, '--checkpoint', default=10, type=int, help='Save a checkpoint every N epochs')
    _add(g, '--tensorboard', action='store_true', help='Write TensorBoard event files')
    _add(g, '--manual_seed', default=1, type=int, help='Random seed')
    _add(g, '--log_interval', default=10, type=int,
         help='Steps between progress updates and train_batch.log flushes')
    _add(g, '--no_progress', action='store_true', help='No progress bar (plain lines instead)')
    _add(g, '--inference_n_clips', default=0, type=int,
         help='Inference on N clips spread evenly over each video instead of the sliding '
              'window (e.g. 10, with --inference_crop three for 30 views); 0: sliding window')
    _add(g, '--extract_features', default=None, type=Path, metavar='PATH.h5',
         help='With --inference: write each video\'s pooled features (the classifier\'s '
              'input, averaged over its views) and ids to this HDF5 file')
    _add(g, '--overwrite', action='store_true',
         help='Start clean in a result_path that holds another run\'s checkpoints: delete its '
              'checkpoints, logs and opts.json (without this a fresh run there is refused)')
    _add(g, '--check_frames', default='all', choices=['last', 'all', 'decode'],
         help='Up-front check of the videos: last (stat the last needed frame), all (list each '
              'video folder once: every needed frame is there; video files: cut short as a clip '
              'would find them, nothing decoded) or decode (decode every frame). A clean result is cached')
    _add(g, '--on_bad_video', default='error', choices=['error', 'skip'],
         help='A video that fails to load during training: error (stop with its name) or skip '
              '(replace the sample, report the video once, count them per epoch)')
    _add(g, '--checkpoint_steps', default=0, type=int,
         help='Also save a mid-epoch checkpoint every N optimizer steps (save_<epoch>_<batch>.pth); '
              'a resumed run continues with the next unseen batch')
    _add(g, '--keep_last', default=0, type=int,
         help='Keep only the K newest save_*.pth (0: all), and best.pth by validation video accuracy')
    _add(g, '--requeue', action='store_true',
         help='Under SLURM: after a stop signal and its checkpoint, requeue the job (scontrol requeue)')
    _add(g, '--deterministic', action='store_true',
         help='Deterministic kernels on GPUs (no cudnn.benchmark; slower): see docs/training.md, what is exact where')

    g = p.add_argument_group('model')
    _add(g, '--model', default='resnet', type=str,
         help='resnet, resnet2p1d, preresnet, wideresnet, resnext, densenet, x3d')
    _add(g, '--model_depth', default=18, type=int, help='Depth of the network')
    _add(g, '--conv1_t_size', default=7, type=int, help='Temporal kernel size of conv1')
    _add(g, '--conv1_t_stride', default=1, type=int, help='Temporal stride of conv1')
    _add(g, '--no_max_pool', action='store_true', help='No max pooling after conv1')
    _add(g, '--resnet_shortcut', default='B', type=str, choices=['A', 'B'],
         help='Shortcut type of resnet (A: parameter-free, B: 1x1x1 conv)')
    _add(g, '--resnet_widen_factor', default=1.0, type=float,
         help='Channel multiplier of resnet and resnet2p1d')
    _add(g, '--wide_resnet_k', default=2, type=int, help='Width of wideresnet')
    _add(g, '--resnext_cardinality', default=32, type=int, help='Groups of resnext')
    _add(g, '--x3d_size', default='s', type=str, choices=list(X3D_DEFAULTS),
         help='Size of x3d (instead of --model_depth; the conv1 and resnet options do not apply). '
              'Its training clip and frame stride (' + ', '.join(
                  f'{name} {d["sample_duration"]}x{d["sample_size"]} every {d["sample_t_stride"]}th frame'
                  for name, d in X3D_DEFAULTS.items()) + ') are the defaults of --sample_duration, '
              '--sample_size and --sample_t_stride, but with --dataset synthetic')

    g = p.add_argument_group('training recipe (all off by default)')
    _add(g, '--label_smoothing', default=0.0, type=float,
         help='Label smoothing of the cross-entropy loss (e.g. 0.1)')
    _add(g, '--mixup_alpha', default=0.0, type=float,
         help='Mixup: Beta(alpha, alpha) mixing of each batch with its mirror (e.g. 0.8)')
    _add(g, '--cutmix_alpha', default=0.0, type=float,
         help='Cutmix: paste one box (the same in every frame) from the mirrored clip (e.g. 1.0)')
    _add(g, '--mix_prob', default=1.0, type=float, help='Chance that a batch is mixed')
    _add(g, '--mix_switch_prob', default=0.5, type=float,
         help='Chance of cutmix instead of mixup when both are on')
    _add(g, '--randaugment', default=None, type=int, nargs=2, metavar=('N', 'M'),
         help='RandAugment of the whole clip: N ops at magnitude M (e.g. 2 9)')
    _add(g, '--random_erasing', default=0.0, type=float,
         help='Chance of erasing one box per clip (the same in every frame)')
    _add(g, '--ema_decay', default=0.0, type=float,
         help='Keep an exponential moving average of the weights with this decay (e.g. 0.999); '
              'validated every epoch beside the raw weights')
    _add(g, '--inference_weights', default='raw', choices=['raw', 'ema'],
         help='Weights used by inference and --no_train validation: raw or the EMA ones')
    _add(g, '--clip_grad_norm', default=0.0, type=float,
         help='Clip the global gradient norm to this value (0: off)')
    _add(g, '--precise_bn', default=0, type=int,
         help='Recompute BatchNorm statistics over N training batches before each validation')
    _add(g, '--grad_checkpointing', action='store_true',
         help='Activation checkpointing per residual stage: less memory, more compute')
    _add(g, '--compile', action='store_true', help='torch.compile the model for training')
    _add(g, '--amp_dtype', default=None, choices=['bf16', 'fp16'],
         help='Autocast type of --amp (default: bf16 where supported, else fp16)')

    g = p.add_argument_group('distributed')
    _add(g, '--distributed', action='store_true',
         help='Distributed data parallel training (under torchrun, or spawning '
              'one process per GPU itself)')
    _add(g, '--batchnorm_sync', action='store_true', help='SyncBatchNorm in distributed mode')
    _add(g, '--dist_url', default='tcp://127.0.0.1:23456', type=str,
         help='Init method when not launched by torchrun')
    _add(g, '--world_size', default=-1, type=int,
         help='Number of nodes when not launched by torchrun')
    _add(g, '--node_rank', default=0, type=int,
         help='Rank of this node when not launched by torchrun')
    _add(g, '--dist_backend', default=None, type=str, choices=['nccl', 'gloo'],
         help='Backend; default nccl with GPUs, gloo on CPU')
    _add(g, '--lr_scaling', default='none', type=str, choices=['none', 'linear'],
         help='linear: lr x (global batch / base_batch_size)')
    _add(g, '--base_batch_size', default=256, type=int,
         help='Batch size the learning rate was tuned for (--lr_scaling linear)')
    _add(g, '--dist_timeout', default=600, type=int,
         help='Seconds a collective waits for the other processes once training started; '
              'then the job exits instead of hanging on a dead or frozen process')
    # Passed by the deprecated torch.distributed.launch.
    p.add_argument('--local_rank', '--local-rank', default=None, type=int,
                   help=argparse.SUPPRESS)
    return p


PATH_OPTIONS = ('video_path', 'annotation_path', 'result_path', 'resume_path', 'pretrain_path',
                'inflate_from')


def _resolve_paths(opt):
    if opt.root_path is not None:
        for name in PATH_OPTIONS:
            value = getattr(opt, name)
            if value is not None and not (isinstance(value, str) and '://' in value):
                setattr(opt, name, opt.root_path / value)


def _fail(message):
    """One line, exit status 2: as main.py reports every other bad input."""
    print(f'error: {message}', file=sys.stderr, flush=True)
    raise SystemExit(2)


# Smallest accepted values; smaller ones would fail later, some after an epoch.
MINIMUMS = dict(
    n_classes=1, sample_size=1, sample_duration=1, sample_t_stride=1, n_val_samples=1,
    learning_rate=0.0, momentum=0.0, dampening=0.0, weight_decay=0.0, min_lr=0.0,
    warmup_epochs=0.0, plateau_patience=0, batch_size=1, inference_batch_size=0,
    n_epochs=0, accumulation_steps=1, inference_stride=1, n_threads=0, checkpoint=1,
    log_interval=1, base_batch_size=1, dist_timeout=1, value_scale=1,
)


def _check(opt):
    if opt.result_path is None:
        _fail('--result_path is required (the folder for logs, checkpoints and results)')
    if opt.dataset != 'synthetic':
        if opt.video_path is None or opt.annotation_path is None:
            _fail(f'--video_path and --annotation_path are required for --dataset '
                  f'{opt.dataset} (or use --dataset synthetic, which needs no download)')
    if opt.storage_options is not None:
        from datasets.storage import check_storage_options  # numpy: only when given
        from utils.errors import OptionError
        try:
            check_storage_options(opt.storage_options)
        except OptionError as e:
            _fail(f'--{e}')
    if opt.input_type == 'flow' and opt.file_type != 'hdf5':
        _fail('--input_type flow needs --file_type hdf5 (datasets video_u/video_v)')
    if opt.decode_device == 'cuda' and (opt.file_type == 'video' or opt.input_type == 'flow'):
        _fail('--decode_device cuda decodes RGB JPEG frames (--file_type jpg or hdf5); video '
              'files and flow are decoded in the loader workers: leave --decode_device out')
    for name, low in MINIMUMS.items():
        if getattr(opt, name) is not None and getattr(opt, name) < low:  # None: not given
            _fail(f'--{name} must be at least {low} (got {getattr(opt, name)})')
    if opt.result_path.exists() and not opt.result_path.is_dir():
        _fail(f'--result_path {opt.result_path} is a file: give a folder (it is created '
              f'if missing)')
    if opt.inference_n_clips < 0 or opt.ft_lr_ratio <= 0:
        _fail('--inference_n_clips must be at least 0 and --ft_lr_ratio positive')
    if opt.checkpoint_steps < 0 or opt.keep_last < 0:
        _fail('--checkpoint_steps and --keep_last must be 0 (off) or positive')
    if opt.inflate_from is not None and opt.pretrain_path is not None:
        _fail('--inflate_from and --pretrain_path both give the starting weights: keep one '
              '(--inflate_from for a 2D ImageNet ResNet, --pretrain_path for a 3D checkpoint)')
    _check_recipe(opt)


def _check_recipe(opt):
    if not 0 <= opt.label_smoothing < 1:
        _fail('--label_smoothing must be in [0, 1)')
    if opt.mixup_alpha < 0 or opt.cutmix_alpha < 0:
        _fail('--mixup_alpha and --cutmix_alpha must be >= 0 (0: off)')
    for name in ('mix_prob', 'mix_switch_prob', 'random_erasing'):
        if not 0 <= getattr(opt, name) <= 1:
            _fail(f'--{name} is a probability: give a value in [0, 1]')
    if opt.randaugment is not None and (opt.randaugment[0] < 1 or not 0 <= opt.randaugment[1] <= 30):
        _fail('--randaugment N M needs N >= 1 ops and a magnitude M in [0, 30]')
    if not 0 <= opt.ema_decay < 1:
        _fail('--ema_decay must be in [0, 1) (0: no EMA; 0.999 is usual)')
    if opt.inference_weights == 'ema' and not opt.no_train and opt.ema_decay == 0:
        _fail('--inference_weights ema needs --ema_decay when training')
    if opt.clip_grad_norm < 0 or opt.precise_bn < 0:
        _fail('--clip_grad_norm and --precise_bn must be >= 0 (0: off)')


# Not taken from --opts_file: what only meant something to the earlier run, and
# the values parse_opts derives (recomputed from the others).
NOT_CARRIED = ('resume_path', 'auto_resume', 'overwrite', 'opts_file', 'local_rank')
DERIVED = ('arch', 'n_input_channels', 'run')


def read_opts_file(path, parser):
    """The options an opts.json holds, as parser defaults: the values as that run
    was given them (root_path taken off the joined paths, an inference batch size
    equal to the batch size back to 0, which follows --batch_size)."""
    try:
        with open(path) as f:
            stored = json.load(f)
    except OSError as e:
        _fail(f'--opts_file {path} cannot be read ({e.strerror}): give the opts.json of a run')
    except json.JSONDecodeError as e:
        _fail(f'--opts_file {path} is not valid JSON ({e}): give the opts.json of a run')
    if not isinstance(stored, dict):
        _fail(f'--opts_file {path} holds no options object: give the opts.json of a run')
    known = vars(parser.parse_args([]))
    unknown = sorted(set(stored) - set(known) - set(DERIVED))
    if unknown:
        print(f'note: --opts_file {path}: {", ".join(unknown)} ignored (no such option now)',
              file=sys.stderr)
    values = {k: v for k, v in stored.items() if k in known and k not in NOT_CARRIED}
    root = values.get('root_path')
    for name in PATH_OPTIONS:
        if root is not None and values.get(name) is not None:
            value = Path(values[name])
            if value.is_relative_to(root):
                values[name] = str(value.relative_to(root))
    if values.get('inference_batch_size') == values.get('batch_size'):
        values['inference_batch_size'] = 0
    return values


def _check_withheld(opt):
    """What an opts.json does not keep (a URL's credentials, --storage_options'
    values) and the command line did not give again: one line naming it."""
    missing = []
    if isinstance(opt.video_path, str) and redacted(opt.video_path):
        missing.append(f'--video_path (kept as {opt.video_path})')
    if isinstance(opt.storage_options, list):
        missing.append(f'--storage_options ({", ".join(opt.storage_options) or "none"})')
    if missing:
        _fail(f'--opts_file {opt.opts_file}: its run\'s credentials and storage option values are not kept: '
              f'give {" and ".join(missing)} again')


def parse_opts(argv=None):
    parser = build_parser()
    opt = parser.parse_args(argv)
    from_file = read_opts_file(opt.opts_file, parser) if opt.opts_file is not None else {}
    if from_file:
        parser.set_defaults(**from_file)
        opt = parser.parse_args(argv)
        _check_withheld(opt)
    if opt.dataset == 'synthetic':
        # Re-parse so that options the user gave (and an opts file) win over the presets.
        parser.set_defaults(**{**SYNTHETIC_DEFAULTS, **from_file})
        opt = parser.parse_args(argv)
    elif opt.model == 'x3d':
        parser.set_defaults(**{**X3D_DEFAULTS[opt.x3d_size], **from_file})
        opt = parser.parse_args(argv)
    _resolve_paths(opt)
    _check(opt)
    if opt.nesterov:
        opt.dampening = 0.0
    if opt.inference_batch_size == 0:
        opt.inference_batch_size = opt.batch_size
    opt.arch = f'{opt.model}-{opt.x3d_size if opt.model == "x3d" else opt.model_depth}'
    opt.n_input_channels = 2 if opt.input_type == 'flow' else 3
    return opt


def option_default(name, dataset=None):
    """The default of option ``name`` (the synthetic preset's with --dataset synthetic)."""
    if dataset == 'synthetic' and name in SYNTHETIC_DEFAULTS:
        return SYNTHETIC_DEFAULTS[name]
    return build_parser().get_default(name)


def option_defaults(dataset=None):
    """Every option's default, as option_default gives them: what the library
    (checkpoint.py), which never imports this module, tells given options by."""
    defaults = vars(build_parser().parse_args([]))
    if dataset == 'synthetic':
        defaults.update(SYNTHETIC_DEFAULTS)
    return defaults


def opts_to_dict(opt):
    """JSON-safe dict of the options (paths as strings, a URL's credentials hidden,
    --storage_options by name only: their values may be keys or tokens)."""
    values = {k: (str(v) if isinstance(v, os.PathLike) else redact_url(v) if k == 'video_path' and v else v)
              for k, v in vars(opt).items()}
    if 'storage_options' in values:
        values['storage_options'] = storage_option_names(values['storage_options'])
    return values


def save_opts(opt, path, run=None):
    """The options as parsed and, under "run", what the run derived from them."""
    content = opts_to_dict(opt)
    if run is not None:
        content['run'] = run
    with atomic_file(path, 'w') as f:
        json.dump(content, f, indent=2, sort_keys=False)
