"""Builds networks from options, loads pretrained weights, sets up fine-tuning
and wraps the model for distributed training."""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from models import densenet, pre_act_resnet, resnet, resnet2p1d, resnext, torchvision_video, wide_resnet, x3d
from models.resnet import DepthError
from utils.checkpoint import load_checkpoint, strip_module_prefix
from utils.distributed import convert_sync_batchnorm, ddp_options, unwrap
from utils.errors import OptionError
from utils.inflate import check_depth_2d, inflate_into, load_2d_state_dict, refuse_family


@dataclass(frozen=True)
class Family:
    """A network family: its builder and the options that map to the builder's own
    keyword arguments (a ResNet-style family, resnet_stem, also takes model_depth and
    the stem arguments of `_stem`; the others n_input_channels only)."""
    build: Callable[..., nn.Module]
    own_arguments: Callable[[object], dict]
    resnet_stem: bool = True


def _shortcut(opt):
    return dict(shortcut_type=opt.resnet_shortcut)


FAMILIES = {
    'resnet': Family(resnet.generate_model, lambda opt: dict(
        _shortcut(opt), widen_factor=opt.resnet_widen_factor)),
    'resnet2p1d': Family(resnet2p1d.generate_model, lambda opt: dict(
        _shortcut(opt), widen_factor=opt.resnet_widen_factor)),
    'preresnet': Family(pre_act_resnet.generate_model, _shortcut),
    'wideresnet': Family(wide_resnet.generate_model, lambda opt: dict(
        _shortcut(opt), k=opt.wide_resnet_k)),
    'resnext': Family(resnext.generate_model, lambda opt: dict(
        _shortcut(opt), cardinality=opt.resnext_cardinality)),
    'densenet': Family(densenet.generate_model, lambda opt: {}),
    'x3d': Family(x3d.generate_model, lambda opt: dict(size=opt.x3d_size), resnet_stem=False),
}
MODEL_CHOICES = tuple(FAMILIES) + tuple(torchvision_video.TORCHVISION_MODELS)


def _stem(opt):
    return dict(n_input_channels=opt.n_input_channels, conv1_t_size=opt.conv1_t_size,
                conv1_t_stride=opt.conv1_t_stride, no_max_pool=opt.no_max_pool)


def generate_model(opt, n_classes=None):
    """The network named by --model/--model_depth with n_classes outputs."""
    n_classes = opt.n_classes if n_classes is None else n_classes
    name = opt.model
    if name in torchvision_video.TORCHVISION_MODELS:
        return torchvision_video.generate_model(name, n_classes=n_classes,
                                                n_input_channels=opt.n_input_channels)
    if name not in FAMILIES:
        raise OptionError(f'--model {name} is unknown; choose one of {", ".join(MODEL_CHOICES)}')
    family = FAMILIES[name]
    if not family.resnet_stem:
        return family.build(n_classes=n_classes, n_input_channels=opt.n_input_channels,
                            **family.own_arguments(opt))
    try:
        return family.build(opt.model_depth, n_classes=n_classes, **_stem(opt),
                            **family.own_arguments(opt))
    except DepthError as e:
        raise OptionError(f'--model_depth {opt.model_depth} is not available for --model '
                          f'{name}; choose one of {e.depths}') from None


def classifier_name(model_name):
    if model_name in torchvision_video.TORCHVISION_MODELS:
        return torchvision_video.classifier_name(model_name)
    return {'densenet': 'classifier', 'x3d': x3d.CLASSIFIER}.get(model_name, 'fc')


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
    size = 'x3d_size' if getattr(opt, 'model', None) == 'x3d' else 'model_depth'
    lines = [f'{source} does not match --model {getattr(opt, "model", "?")} '
             f'--{size} {getattr(opt, size, "?")}:']
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
    own_cls = model.state_dict().get(cls)
    if cls in state_dict and (own_cls is None or own_cls.shape != state_dict[cls].shape):
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
    sizes = x3d.sizes_matching(state_dict) if opt.model == 'x3d' else None
    if sizes and opt.x3d_size not in sizes:
        hints.append(f'  hint: the checkpoint is the network of X3D-{"/".join(s.upper() for s in sizes)}: '
                     f'use --x3d_size {" or ".join(sizes)}')
    return hints


def load_pretrained_model(opt, n_classes):
    """--pretrain_path: a predecessor checkpoint (dict with 'state_dict'), one of
    PyTorchVideo's (its weights under 'model_state') or a bare state_dict, built
    for --n_pretrain_classes (0: as many as its classifier has); the classifier
    is then replaced by one with n_classes outputs."""
    ckpt = load_checkpoint(opt.pretrain_path)
    state_dict = strip_module_prefix(next((ckpt[k] for k in ('state_dict', 'model_state') if k in ckpt), ckpt))
    head = state_dict.get(classifier_name(opt.model) + '.weight')
    n_pretrain = opt.n_pretrain_classes or (head.shape[0] if head is not None else n_classes)
    model = generate_model(opt, n_classes=n_pretrain)
    load_state_dict_checked(model, state_dict, f'--pretrain_path {opt.pretrain_path}', opt)
    return replace_classifier(model, opt.model, n_classes)


def load_inflated_model(opt, n_classes, report=None):
    """--inflate_from: a new network whose kernels and BatchNorm come from a 2D
    ImageNet ResNet (utils/inflate.py); its classifier keeps its fresh init.
    report(line) gets the one line saying what came from where."""
    refuse_family(opt.model)
    state_2d = load_2d_state_dict(opt.inflate_from)
    check_depth_2d(state_2d, opt.model_depth, opt.inflate_from)
    model = generate_model(opt, n_classes=n_classes)
    source = f'--inflate_from {opt.inflate_from}'
    inflation = inflate_into(model, state_2d, source, opt.model, classifier_name(opt.model))
    if report is not None:
        note = '' if opt.mean_dataset == 'imagenet' else \
            '; ImageNet weights expect ImageNet-normalised input: --mean_dataset imagenet'
        report(inflation.summary(source) + note)
    return model


def build_model(opt, n_classes, pretrained=True, report=None):
    """The network ready for training: pretrained or inflated weights loaded if
    asked (not when resuming, whose checkpoint replaces them: pretrained=False),
    the classifier sized for n_classes (the run's: main.py's run record).
    report(line): where one line on the inflation goes."""
    if opt.pretrain_path is not None and pretrained:
        return load_pretrained_model(opt, n_classes)
    if opt.inflate_from is not None and pretrained:
        return load_inflated_model(opt, n_classes, report)
    return generate_model(opt, n_classes=n_classes)


def freeze_before(model, ft_begin_module):
    """Freezes every top-level module listed before ft_begin_module: no gradients
    and no BatchNorm statistic updates (the training loop passes the returned
    names to keep_frozen_eval after each model.train())."""
    if not ft_begin_module:
        return ()
    names = [name for name, _ in _top_level_modules(model)]
    # A parent of listed modules (x3d's blocks.5) begins at its first one.
    begin = next((i for i, name in enumerate(names) if name == ft_begin_module
                  or name.startswith(ft_begin_module + '.')), None)
    if begin is None:
        raise OptionError(f'--ft_begin_module {ft_begin_module} is not a module of this model; '
                         f'choose one of {", ".join(names)}')
    frozen = names[:begin]
    for name, module in _top_level_modules(model):
        if name in frozen:
            module.requires_grad_(False)
            module.eval()
    return tuple(frozen)


def keep_frozen_eval(model, frozen_modules):
    """Call after model.train(): frozen modules keep their BN statistics."""
    if frozen_modules:
        for name, module in _top_level_modules(unwrap(model)):
            if name in frozen_modules:
                module.eval()


def _top_level_modules(model):
    # DenseNet keeps its layers under `features`; the predecessor's rule names
    # them (denseblock1, ...) as if they were top level. X3D's are blocks.0 ..
    # blocks.4 and the head's pool and proj (blocks.5.proj alone: a linear probe);
    # its dropout is left out, so that a frozen pool never switches it off.
    for name, module in model.named_children():
        if name == 'features' and isinstance(module, nn.Sequential):
            yield from module.named_children()
        elif name == 'blocks' and isinstance(model, x3d.X3D):
            yield from ((f'blocks.{i}', block) for i, block in enumerate(module[:-1]))
            yield from ((f'blocks.{len(module) - 1}.{part}', getattr(module[-1], part)) for part in ('pool', 'proj'))
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
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                          **ddp_options(batchnorm_sync))
    return model
