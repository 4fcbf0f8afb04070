"""Checkpoint names, their order, and which ones are kept (--keep_last, best.pth).

save_<epoch>.pth is written after epoch <epoch> (3D-ResNets-PyTorch's name);
save_<epoch>_<batch>.pth inside epoch <epoch>, after <batch> of its batches
(--checkpoint_steps, or a stop signal). A checkpoint being written is a
hidden temporary file until it is complete, so it is never a candidate here.
"""
import json
import math
import re
from pathlib import Path

from utils.atomic import write_atomic

CHECKPOINT_NAME = re.compile(r'^save_(\d+)(?:_(\d+))?\.pth$')
BEST = 'best.pth'


def checkpoint_name(epoch, batches_done=0):
    """The file for a checkpoint after `batches_done` batches of `epoch` (0: the
    whole epoch)."""
    return f'save_{epoch}.pth' if batches_done == 0 else f'save_{epoch}_{batches_done}.pth'


def checkpoint_progress(name):
    """(completed epochs, batches done in the next epoch) for a checkpoint
    file name, None for any other file: sorts checkpoints oldest first."""
    m = CHECKPOINT_NAME.match(name)
    if m is None:
        return None
    epoch = int(m.group(1))
    return (epoch, 0) if m.group(2) is None else (epoch - 1, int(m.group(2)))


def checkpoints_newest_first(result_path):
    found = [(checkpoint_progress(p.name), p) for p in Path(result_path).iterdir()]
    return [p for progress, p in sorted((f for f in found if f[0] is not None), reverse=True)]


def prune_checkpoints(result_path, keep_last):
    """Deletes all but the keep_last newest save_*.pth (0: keeps all); best.pth
    is not one of them. Returns the deleted paths."""
    if keep_last <= 0:
        return []
    old = checkpoints_newest_first(result_path)[keep_last:]
    for path in old:
        path.unlink(missing_ok=True)
    return old


def better_epoch(candidate, best):
    """Whether the epoch record `candidate` replaces `best` (None: none yet) as
    best.pth; records are {'epoch', 'val_video_acc', 'val_loss'}. The higher
    validation video accuracy wins; a tie (frequent on a few videos), the
    lower validation loss (missing or nan: the highest); then the later epoch."""
    if best is None:
        return True
    if candidate['val_video_acc'] != best['val_video_acc']:
        return candidate['val_video_acc'] > best['val_video_acc']
    new, old = _loss_of(candidate), _loss_of(best)
    if new != old:
        return new < old
    return candidate['epoch'] > best['epoch']


def _loss_of(record):
    loss = record.get('val_loss')
    return loss if isinstance(loss, (int, float)) and math.isfinite(loss) else math.inf


class BestTracker:
    """best.pth: the checkpoint of the best epoch so far by better_epoch;
    best.json records it, and lets a resumed run continue the comparison."""

    def __init__(self, result_path):
        self.record = Path(result_path) / 'best.json'
        self.path = Path(result_path) / BEST
        self.best = None
        if self.record.is_file() and self.path.is_file():
            self.best = json.loads(self.record.read_text())

    def improves(self, epoch, video_acc, val_loss=None):
        return better_epoch(_epoch_record(epoch, video_acc, val_loss), self.best)

    def saved(self, epoch, video_acc, val_loss=None):
        """Call after best.pth was written for `epoch`."""
        self.best = _epoch_record(epoch, video_acc, val_loss)
        write_atomic(self.record, json.dumps(self.best))


def _epoch_record(epoch, video_acc, val_loss):
    # nan is not JSON: stored as null, compared as the highest loss
    loss = val_loss if val_loss is not None and math.isfinite(val_loss) else None
    return {'epoch': epoch, 'val_video_acc': video_acc, 'val_loss': loss}


def drop_best_after(result_path, last_epoch):
    """best.pth and best.json of an epoch after last_epoch (the resumed
    checkpoint's completed epochs; 0 for a fresh run) belong to a history the
    run redoes or is not its own: both are deleted, as the logs' rows of those
    epochs are (best.pth without a readable best.json too). Returns the epoch
    best.pth was of (None: nothing deleted)."""
    record, path = Path(result_path) / 'best.json', Path(result_path) / BEST
    try:
        epoch = json.loads(record.read_text())['epoch']
    except (OSError, ValueError, KeyError, TypeError):
        epoch = None  # no record: best.pth cannot be compared
        if not path.exists():
            record.unlink(missing_ok=True)
            return None
    if epoch is not None and epoch <= last_epoch:
        return None
    path.unlink(missing_ok=True)
    record.unlink(missing_ok=True)
    return epoch if epoch is not None else '?'
