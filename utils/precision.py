"""Mixed precision (--amp, --amp_dtype): the autocast type and its context,
shared by training, validation, inference and the benchmarks; the GPUs that
cannot run bf16, and deterministic kernels (--deterministic)."""
import contextlib
import os

import torch

from utils.errors import OptionError

AMP_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16}


def amp_dtype(device, dtype_name=None):
    """--amp_dtype when given; else bfloat16 where the GPU computes it natively
    (compute capability 8.0 and up: A100, H100, RTX 30xx) and float16 with a
    GradScaler below (V100, T4, RTX 20xx), where torch.cuda.is_bf16_supported()
    counts emulation and cuDNN has no bf16 convolutions."""
    if dtype_name is not None:
        return AMP_DTYPES[dtype_name]
    if device.type == 'cuda' and torch.cuda.get_device_capability(device) < (8, 0):
        return torch.float16
    return torch.bfloat16


def autocast_context(device, enabled, dtype_name=None):
    """torch.autocast on `device` in amp_dtype(device, dtype_name); a context
    that changes nothing when not enabled."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype(device, dtype_name))


def refuse_bf16_below_sm80(amp, dtype_name, device):
    """--amp_dtype bf16 on a GPU below compute capability 8.0 (V100, T4, RTX 20xx):
    torch.cuda.is_bf16_supported() says yes there (it counts emulation), but
    cuDNN has no bf16 3D convolutions to run."""
    if not (amp and dtype_name == 'bf16' and device.type == 'cuda'):
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 0):
        raise OptionError(f'--amp_dtype bf16 needs a GPU of compute capability 8.0 or more '
                          f'(A100, H100, RTX 30xx); {torch.cuda.get_device_name(device)} '
                          f'has {major}.{minor}: leave --amp_dtype out (fp16 with a '
                          f'GradScaler there) or give --amp_dtype fp16')


def make_deterministic():
    """Deterministic kernels where torch has them; torch warns for the few it
    has not (on GPUs: AdaptiveAvgPool3d backward, NLLLoss). The cuBLAS setting
    must be in place before its first use."""
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
