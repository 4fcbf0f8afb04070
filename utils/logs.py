"""A run's logs: tab-separated files with 3D-ResNets-PyTorch's names and
columns (train.log, train_batch.log, val.log), cut back to the resumed
checkpoint, and the TensorBoard writer."""
import contextlib
import csv
import os
from pathlib import Path

LOG_NAMES = ('train.log', 'train_batch.log', 'val.log')
TRAIN_LOG_COLUMNS = ['epoch', 'loss', 'acc', 'lr', 'clips_per_s', 'data_wait']
BATCH_LOG_COLUMNS = ['epoch', 'batch', 'iter', 'loss', 'acc', 'lr']
VAL_LOG_COLUMNS = ['epoch', 'loss', 'acc', 'clip_acc']


class TsvLogger:
    """Appends rows to a tab-separated file; writes the header only when the file
    is new, so a resumed run continues the same log instead of truncating it."""

    def __init__(self, path, header):
        self.path = Path(path)
        self.header = list(header)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.file = open(self.path, 'a', newline='')
        self.writer = csv.writer(self.file, delimiter='\t')
        if new:
            self.writer.writerow(self.header)
            self.file.flush()

    def log(self, values):
        self.log_many([values])

    def log_many(self, rows):
        for values in rows:
            self.writer.writerow([_fmt(values[col]) for col in self.header])
        self.file.flush()

    def close(self):
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _fmt(value):
    if isinstance(value, float):
        return f'{value:.6g}'
    return value


def read_tsv(path):
    """Rows of a log as dicts of strings (for tests and tools)."""
    with open(path, newline='') as f:
        return list(csv.DictReader(f, delimiter='\t'))


def truncate_log(path, last_epoch, last_iter=None):
    """Drops the rows after a checkpoint before a resumed run appends again, so
    the log equals an uninterrupted run's: rows with epoch > last_epoch (and,
    when last_iter is given and the log has an 'iter' column, iter > last_iter),
    and a torn last row of a killed write. The file is replaced atomically, so
    a kill during the truncation leaves either the old or the new log. Returns
    the number of rows dropped."""
    path = Path(path)
    if not path.is_file():
        return 0
    with open(path, newline='') as f:
        lines = f.read().split('\n')
    if not lines or not lines[0]:
        return 0
    header = lines[0].rstrip('\r').split('\t')  # csv writes '\r\n'
    epoch_col = header.index('epoch') if 'epoch' in header else None
    iter_col = header.index('iter') if (last_iter is not None and 'iter' in header) else None
    kept = [lines[0]]
    dropped = 0
    # The text after the last '\n' is a row whose write was cut short (or '').
    for line in lines[1:-1]:
        fields = line.rstrip('\r').split('\t')
        if _keep_row(fields, len(header), epoch_col, last_epoch, iter_col, last_iter):
            kept.append(line)
        else:
            dropped += 1
    dropped += bool(lines[-1])
    if dropped:
        tmp = path.with_name(f'.{path.name}.truncate.tmp')
        with open(tmp, 'w', newline='') as f:
            f.write('\n'.join(kept) + '\n')
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return dropped


def _keep_row(fields, n_columns, epoch_col, last_epoch, iter_col, last_iter):
    if len(fields) != n_columns:
        return False
    try:
        if epoch_col is not None and int(fields[epoch_col]) > last_epoch:
            return False
        if iter_col is not None and int(fields[iter_col]) > last_iter:
            return False
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def training_logs(opt, ctx, with_val, last_epoch, last_iter=None):
    """train.log, train_batch.log and val.log (rank 0; None elsewhere), closed
    also when the run fails. Rows of epochs after last_epoch (the resumed
    checkpoint's, or 0) are dropped first, and after a mid-epoch checkpoint the
    batch rows after last_iter: the logs then equal an uninterrupted run's."""
    with contextlib.ExitStack() as stack:
        logs = dict(train=None, batch=None, val=None)
        if ctx.is_main:
            for name in LOG_NAMES:
                if name == 'train_batch.log' and last_iter is not None:
                    truncate_log(opt.result_path / name, last_epoch + 1, last_iter)
                else:
                    truncate_log(opt.result_path / name, last_epoch)
            logs['train'] = stack.enter_context(TsvLogger(opt.result_path / 'train.log',
                                                          TRAIN_LOG_COLUMNS))
            logs['batch'] = stack.enter_context(TsvLogger(opt.result_path / 'train_batch.log',
                                                          BATCH_LOG_COLUMNS))
            if with_val:
                ema_columns = ['ema_loss', 'ema_acc'] if opt.ema_decay > 0 else []
                logs['val'] = stack.enter_context(TsvLogger(
                    opt.result_path / 'val.log', [*VAL_LOG_COLUMNS, *ema_columns]))
        yield logs


def tensorboard_writer(opt, ctx, record):
    """A SummaryWriter on rank 0 with --tensorboard (closed when the run ends or
    fails), else None. A resumed run purges the events of the epochs it redoes
    (every tag is logged per epoch), as the text logs are cut back."""
    if not (opt.tensorboard and ctx.is_main):
        return contextlib.nullcontext(None)
    from torch.utils.tensorboard import SummaryWriter  # only with --tensorboard
    purge_step = record.begin_epoch if record.resume_path is not None else None
    return SummaryWriter(log_dir=str(opt.result_path), purge_step=purge_step)
