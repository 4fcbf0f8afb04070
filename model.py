"""Builds networks from options, loads pretrained weights, sets up fine-tuning
and wraps the model for distributed training."""
import torch
import torch.nn as nn

from models import densenet, pre_act_resnet, resnet, resnet2p1d, resnext, torchvision_video, wide_resnet
from models.resnet import BOTTLENECK_DEPTHS, STAGE_BLOCKS
from opts import OptionError
from utils.checkpoint import load_checkpoint, strip_module_prefix
from utils.distributed import convert_sync_batchnorm, unwrap

MODEL_CHOICES = ('resnet', 'resnet2p1d', 'preresnet', 'wideresnet', 'resnext', 'densenet') + \
    tuple(torchvision_video.TORCHVISION_MODELS)

RESNET_DEPTHS = tuple(STAGE_BLOCKS)
DEPTHS = {
    'resnet': RESNET_DEPTHS,
    'resnet2p1d': RESNET_DEPTHS,
    'preresnet': RESNET_DEPTHS,
    'wideresnet': BOTTLENECK_DEPTHS,
    'resnext': BOTTLENECK_DEPTHS,
    'densenet': tuple(densenet.DEPTH_CONFIGS),
}


def generate_model(opt, n_classes=None):
    """The network named by --model/--model_depth with n_classes outputs."""
    n_classes = opt.n_classes if n_classes is None else n_classes
    name = opt.model
    if name not in MODEL_CHOICES:
        raise OptionError(f'--model {name} is unknown; choose one of {", ".join(MODEL_CHOICES)}')
    if name in torchvision_video.TORCHVISION_MODELS:
        return torchvision_video.generate_model(name, n_classes=n_classes,
                                                n_input_channels=opt.n_input_channels)
    if opt.model_depth not in DEPTHS[name]:
        raise OptionError(f'--model_depth {opt.model_depth} is not available for --model {name}; '
                         f'choose one of {DEPTHS[name]}')
    common = dict(n_classes=n_classes, n_input_channels=opt.n_input_channels,
                  conv1_t_size=opt.conv1_t_size, conv1_t_stride=opt.conv1_t_stride,
                  no_max_pool=opt.no_max_pool)
    shortcut = dict(shortcut_type=opt.resnet_shortcut)
    if name == 'resnet':
        return resnet.generate_model(opt.model_depth, widen_factor=opt.resnet_widen_factor,
                                     **shortcut, **common)
    if name == 'resnet2p1d':
        return resnet2p1d.generate_model(opt.model_depth, widen_factor=opt.resnet_widen_factor,
                                         **shortcut, **common)
    if name == 'preresnet':
        return pre_act_resnet.generate_model(opt.model_depth, **shortcut, **common)
    if name == 'wideresnet':
        return wide_resnet.generate_model(opt.model_depth, k=opt.wide_resnet_k,
                                          **shortcut, **common)
    if name == 'resnext':
        return resnext.generate_model(opt.model_depth, cardinality=opt.resnext_cardinality,
                                      **shortcut, **common)
    return densenet.generate_model(opt.model_depth, **common)


def classifier_name(model_name):
    if model_name in torchvision_video.TORCHVISION_MODELS:
        return torchvision_video.classifier_name(model_name)
    return 'classifier' if model_name == 'densenet' else 'fc'


def replace_classifier(model, model_name, n_classes):
    """Swaps the final Linear for a freshly initialised one with n_classes outputs."""
    path = classifier_name(model_name).split('.')
    parent = model
    for part in path[:-1]:
        parent = getattr(parent, part)
    old = getattr(parent, path[-1])
    if isinstance(old, nn.Linear):
        new = nn.Linear(old.in_features, n_classes)
    elif isinstance(old, nn.Conv3d) and old.kernel_size == (1, 1, 1):  # s3d's classifier
        new = nn.Conv3d(old.in_channels, n_classes, kernel_size=1, bias=old.bias is not None)
    else:
        raise TypeError(f'{".".join(path)} of {model_name} is neither a Linear layer nor a '
                        f'1x1x1 convolution')
    setattr(parent, path[-1], new.to(old.weight.device))
    return model


def load_state_dict_checked(model, state_dict, source, opt=None):
    """Strict load with an error that lists what differs and hints at the fix."""
    state_dict = strip_module_prefix(state_dict)
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    mismatched = [k for k in own if k in state_dict and own[k].shape != state_dict[k].shape]
    if not (missing or unexpected or mismatched):
        model.load_state_dict(state_dict, strict=True)
        return
    lines = [f'{source} does not match --model {getattr(opt, "model", "?")} '
             f'--model_depth {getattr(opt, "model_depth", "?")}:']
    for label, keys in (('missing', missing), ('unexpected', unexpected)):
        if keys:
            lines.append(f'  {len(keys)} {label} keys: {", ".join(keys[:8])}'
                         + (' ...' if len(keys) > 8 else ''))
    for k in mismatched[:8]:
        lines.append(f'  {k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}')
    lines.extend(_mismatch_hints(model, state_dict, opt))
    raise OptionError('\n'.join(lines))


def _mismatch_hints(model, state_dict, opt):
    hints = []
    if opt is None:
        return hints
    cls = classifier_name(opt.model) + '.weight'
    if cls in state_dict:
        n = state_dict[cls].shape[0]
        hints.append(f'  hint: this checkpoint has {n} classes: use --n_pretrain_classes {n} '
                     f'(with --pretrain_path) or --n_classes {n} (with --resume_path)')
    if any('downsample' in k for k in state_dict) and \
            not any('downsample' in k for k in model.state_dict()):
        hints.append('  hint: the checkpoint has downsample layers: use --resnet_shortcut B')
    if not any('downsample' in k for k in state_dict) and \
            any('downsample' in k for k in model.state_dict()):
        hints.append('  hint: the checkpoint has no downsample layers: use --resnet_shortcut A')
    w = state_dict.get('conv1.weight')
    own_w = model.state_dict().get('conv1.weight')
    if w is not None and own_w is not None and w.shape != own_w.shape:
        hints.append(f'  hint: the checkpoint\'s conv1 is {tuple(w.shape)} (out, in, t, h, w): '
                     f'check --conv1_t_size, --input_type and --resnet_widen_factor')
    return hints


def load_pretrained_model(model, opt):
    """--pretrain_path: a predecessor checkpoint (dict with 'state_dict') or a bare
    state_dict, built for n_pretrain_classes; the classifier is then replaced
    by one with n_classes outputs."""
    ckpt = load_checkpoint(opt.pretrain_path)
    state_dict = ckpt['state_dict'] if 'state_dict' in ckpt else ckpt
    load_state_dict_checked(model, state_dict, f'--pretrain_path {opt.pretrain_path}', opt)
    return replace_classifier(model, opt.model, opt.n_classes)


def build_model(opt):
    """The network ready for training: pretrained weights loaded if asked, the
    classifier sized for n_classes."""
    if opt.pretrain_path is not None:
        n_pretrain = opt.n_pretrain_classes or opt.n_classes
        model = generate_model(opt, n_classes=n_pretrain)
        model = load_pretrained_model(model, opt)
    else:
        model = generate_model(opt)
    return model


def freeze_before(model, ft_begin_module):
    """Freezes every top-level module listed before ft_begin_module: no gradients
    and no BatchNorm statistic updates (keep_frozen_eval puts them in eval mode
    after each model.train()). Returns the frozen module names."""
    if not ft_begin_module:
        return []
    names = [name for name, _ in _top_level_modules(model)]
    if ft_begin_module not in names:
        raise OptionError(f'--ft_begin_module {ft_begin_module} is not a module of this model; '
                         f'choose one of {", ".join(names)}')
    frozen = names[:names.index(ft_begin_module)]
    for name, module in _top_level_modules(model):
        if name in frozen:
            module.requires_grad_(False)
            module.eval()
    model._frozen_modules = frozen
    return frozen


def keep_frozen_eval(model):
    """Call after model.train(): frozen modules keep their BN statistics."""
    net = unwrap(model)
    frozen = set(getattr(net, '_frozen_modules', ()))
    if frozen:
        for name, module in _top_level_modules(net):
            if name in frozen:
                module.eval()


def _top_level_modules(model):
    # DenseNet keeps its layers under `features`; the predecessor's rule names
    # them (denseblock1, ...) as if they were top level.
    for name, module in model.named_children():
        if name == 'features' and isinstance(module, nn.Sequential):
            yield from module.named_children()
        else:
            yield name, module


def make_parallel(model, ctx, batchnorm_sync=False, channels_last=False):
    """Moves the model to its device and wraps it in DDP in distributed runs."""
    if ctx.distributed and batchnorm_sync:
        model = convert_sync_batchnorm(model, ctx.device)
    model = model.to(ctx.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    if ctx.distributed:
        device_ids = [ctx.local_rank] if ctx.device.type == 'cuda' else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    return model
