"""Checkpoints in 3D-ResNets-PyTorch's format, written atomically and loaded safely."""
import os
import random
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_RE = re.compile(r'^save_(\d+)\.pth$')


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded; the message names the file."""


def strip_module_prefix(state_dict):
    """Accepts state dicts saved from DataParallel/DDP ('module.' prefix)."""
    if state_dict and all(k.startswith('module.') for k in state_dict):
        return {k[len('module.'):]: v for k, v in state_dict.items()}
    return state_dict


def load_checkpoint(path, map_location='cpu'):
    """Loads a checkpoint without executing pickled code (weights_only=True)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f'checkpoint {path} does not exist: check the path '
                                f'(it is prefixed with --root_path when that is set)')
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated file, foreign pickle, ...
        raise CheckpointError(f'cannot load checkpoint {path} with weights_only=True '
                              f'(truncated, or it holds pickled code): {e}') from e


def save_checkpoint_atomic(obj, path):
    """Writes to a temporary file in the same folder, then renames: a kill during
    the write never leaves a corrupt save_<epoch>.pth behind."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=path.parent)
    try:
        with os.fdopen(fd, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def find_latest_checkpoint(result_path):
    """The newest save_<epoch>.pth in result_path that loads, or None."""
    result_path = Path(result_path)
    if not result_path.is_dir():
        return None
    found = []
    for p in result_path.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    for _, p in sorted(found, reverse=True):
        try:
            ckpt = load_checkpoint(p)
            if 'state_dict' in ckpt and 'epoch' in ckpt:
                return p
        except CheckpointError:
            continue
    return None


def capture_rng_state():
    """RNG states as weights_only-loadable objects (tensors, ints, lists)."""
    np_state = np.random.get_state()
    state = {
        'python': random.getstate(),
        'numpy': [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        'torch': torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This process's device only: get_rng_state_all() would create a CUDA
        # context on every other GPU of the node from rank 0.
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state):
    if not state:
        return
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state['cuda'])
