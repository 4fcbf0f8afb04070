"""Mixed precision (--amp, --amp_dtype): the autocast type and its context,
shared by training, validation, inference and the benchmarks."""
import contextlib

import torch

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
