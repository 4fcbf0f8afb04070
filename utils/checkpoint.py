"""Checkpoints in 3D-ResNets-PyTorch's format, written atomically and loaded safely."""
import random
from pathlib import Path

import numpy as np
import torch

from utils.atomic import atomic_file, temporary_pattern
from utils.errors import CheckpointError, CheckpointWriteError
from utils.retention import checkpoint_progress, checkpoints_newest_first

# save_checkpoint_atomic's temporaries (utils/atomic.py's, of save_*.pth).
TEMPORARY_RE = temporary_pattern(r'save_[^/]*\.pth')


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
    if not _looks_like_torch_save(path):
        raise CheckpointError(f'{path} is not a checkpoint (not a file written by torch.save): '
                              f'check the path')
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated file, foreign pickle, ...
        raise CheckpointError(f'cannot load checkpoint {path} with weights_only=True '
                              f'(truncated, or it holds pickled code): {_first_line(e)}') from e


def load_training_checkpoint(path, map_location='cpu'):
    """A checkpoint to resume from: a dict with at least 'epoch' and 'state_dict'."""
    ckpt = load_checkpoint(path, map_location)
    if not isinstance(ckpt, dict) or 'state_dict' not in ckpt or 'epoch' not in ckpt:
        keys = ', '.join(map(str, ckpt)) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f'{path} is not a training checkpoint (it needs "epoch" and '
                              f'"state_dict", it has: {keys or "nothing"}): use a save_<epoch>.pth '
                              f'of a run, or --pretrain_path for bare weights')
    return ckpt


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _looks_like_torch_save(path):
    """torch.save writes a zip archive (before torch 1.6 a pickle: protocol byte 0x80);
    a truncated one still starts like one and gets load's own message."""
    with open(path, 'rb') as f:
        head = f.read(4)
    return head.startswith(b'PK\x03\x04') or head[:1] == b'\x80'


def save_checkpoint_atomic(obj, path):
    """Writes to a temporary file in the same folder, then renames: a kill during
    the write never leaves a corrupt save_<epoch>.pth behind."""
    path = Path(path)
    opened = False
    try:
        with atomic_file(path) as f:
            opened = True
            torch.save(obj, f)
    except BaseException as e:
        os_error = _os_error_in_chain(e)
        if os_error is None:
            raise
        if not opened:
            raise CheckpointWriteError(f'cannot create a file in {path.parent} to write checkpoint '
                                       f'{path.name} ({os_error.strerror}): fix the folder\'s '
                                       f'permissions or free space, then resume; earlier '
                                       f'checkpoints are intact') from e
        # torch.save reports a failed write as "unexpected pos ..."; say what failed.
        reason = os_error.strerror or str(os_error)
        raise CheckpointWriteError(f'cannot write checkpoint {path} ({reason}): free space or '
                                   f'fix the folder\'s permissions, then resume; earlier '
                                   f'checkpoints are intact') from e


def _os_error_in_chain(error):
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def remove_stale_temporaries(result_path):
    """Deletes the temporaries of checkpoint writes that were killed (they are
    never renamed into place). Call only while holding the result folder's
    lock: a live writer's temporary matches the same pattern. Returns the names."""
    result_path = Path(result_path)
    if not result_path.is_dir():
        return []
    removed = []
    for p in result_path.iterdir():
        if TEMPORARY_RE.match(p.name) and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return sorted(removed)


def list_checkpoints(result_path):
    """save_<epoch>.pth and mid-epoch save_<epoch>_<batch>.pth files of
    result_path as (completed epochs, path) pairs, oldest first."""
    result_path = Path(result_path)
    if not result_path.is_dir():
        return []
    return [(checkpoint_progress(p.name)[0], p)
            for p in reversed(checkpoints_newest_first(result_path))]


def find_latest_checkpoint(result_path):
    """The newest checkpoint in result_path that loads (mid-epoch ones
    included), or None."""
    result_path = Path(result_path)
    if not result_path.is_dir():
        return None
    for p in checkpoints_newest_first(result_path):  # mid-epoch ones too
        try:
            ckpt = load_checkpoint(p)
            if 'state_dict' in ckpt and 'epoch' in ckpt:
                return p
        except CheckpointError:
            continue
    return None


def capture_rng_state(device=None):
    """RNG states as weights_only-loadable objects (tensors, ints, lists); on a
    CUDA `device`, that device's generator too (a ByteTensor on the CPU)."""
    np_state = np.random.get_state()
    state = {
        'python': random.getstate(),
        'numpy': [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        'torch': torch.get_rng_state(),
    }
    if device is not None and torch.device(device).type == 'cuda':
        # This process's device only: get_rng_state_all() would create a CUDA
        # context on every other GPU of the node.
        state['cuda'] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state, device=None):
    """Sets the states capture_rng_state returned; the CUDA one on a CUDA
    `device` (a GPU checkpoint resumed on CPU keeps only the CPU states)."""
    if not state:
        return
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and device is not None and torch.device(device).type == 'cuda':
        torch.cuda.set_rng_state(state['cuda'], device)
