"""A run's logs: tab-separated files with 3D-ResNets-PyTorch's names and
columns (train.log, train_batch.log, val.log), cut back to the resumed
checkpoint; with --tensorboard the event files (per-epoch scalars, per-step
scalars, the hyper-parameters with the final metrics), without it
curves.png."""
import contextlib
import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from utils.atomic import atomic_file, atomic_path

LOG_NAMES = ('train.log', 'train_batch.log', 'val.log')
TRAIN_LOG_COLUMNS = ['epoch', 'loss', 'acc', 'lr', 'clips_per_s', 'data_wait']
BATCH_LOG_COLUMNS = ['epoch', 'batch', 'iter', 'loss', 'acc', 'lr']
VAL_LOG_COLUMNS = ['epoch', 'loss', 'acc', 'clip_acc']
STEP_RUN = 'train_steps'  # the per-step scalars' TensorBoard run: <result_path>/train_steps/
CURVES_NAME = 'curves.png'  # drawn when TensorBoard is off


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
        with atomic_file(path, 'w', newline='') as f:
            f.write('\n'.join(kept) + '\n')
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
def training_logs(opt, ctx, with_val, last_epoch, last_iter=None, resumed_step=0):
    """train.log, train_batch.log (a BatchLog) and val.log (rank 0; None
    elsewhere), closed also when the run fails. Rows of epochs after
    last_epoch (the resumed checkpoint's, or 0) are dropped first, and after a
    mid-epoch checkpoint the batch rows after last_iter: the logs then equal
    an uninterrupted run's. resumed_step: the batches the checkpoint covers,
    after which the per-step TensorBoard scalars are purged."""
    with contextlib.ExitStack() as stack:
        logs = dict(train=None, batch=None, val=None, curves=None)
        if ctx.is_main:
            for name in LOG_NAMES:
                if name == 'train_batch.log' and last_iter is not None:
                    truncate_log(opt.result_path / name, last_epoch + 1, last_iter)
                else:
                    truncate_log(opt.result_path / name, last_epoch)
            logs['train'] = stack.enter_context(TsvLogger(opt.result_path / 'train.log',
                                                          TRAIN_LOG_COLUMNS))
            steps = summary_writer(opt.result_path / STEP_RUN, resumed_step + 1 if resumed_step else None) \
                if opt.tensorboard and tensorboard_installed() else None
            logs['batch'] = stack.enter_context(BatchLog(
                TsvLogger(opt.result_path / 'train_batch.log', BATCH_LOG_COLUMNS), steps))
            if with_val:
                ema_columns = ['ema_loss', 'ema_acc'] if opt.ema_decay > 0 else []
                logs['val'] = stack.enter_context(TsvLogger(
                    opt.result_path / 'val.log', [*VAL_LOG_COLUMNS, *ema_columns]))
            if not (opt.tensorboard and tensorboard_installed()):
                logs['curves'] = stack.enter_context(CurvesPainter(opt.result_path))
        yield logs


class BatchLog:
    """train_batch.log's rows, and with TensorBoard (`writer`) every
    --log_interval steps the interval's mean loss and accuracy and the
    learning rate of its last step, against the global step ('iter'), as
    train_step/loss, train_step/acc and train_step/lr."""

    def __init__(self, tsv, writer=None):
        self.tsv, self.writer = tsv, writer

    def log_many(self, rows):
        rows = list(rows)
        self.tsv.log_many(rows)
        if self.writer is None or not rows:
            return
        step = rows[-1]['iter']
        for key in ('loss', 'acc'):
            self.writer.add_scalar(f'train_step/{key}', sum(r[key] for r in rows) / len(rows), step)
        self.writer.add_scalar('train_step/lr', rows[-1]['lr'], step)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.tsv.close()
        if self.writer is not None:
            self.writer.close()


def tensorboard_installed():
    return importlib.util.find_spec('tensorboard') is not None


def summary_writer(log_dir, purge_step=None):
    from torch.utils.tensorboard import SummaryWriter  # only with --tensorboard
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


def tensorboard_writer(opt, ctx, record):
    """A SummaryWriter on rank 0 with --tensorboard (closed when the run ends or
    fails), else None. A resumed run purges the events of the epochs it redoes
    (every tag of this run is logged per epoch; the per-step scalars are a run
    of their own, STEP_RUN), as the text logs are cut back."""
    if not (opt.tensorboard and ctx.is_main):
        return contextlib.nullcontext(None)
    if not tensorboard_installed():
        print('note: --tensorboard needs the tensorboard package (pip install tensorboard): '
              f'{CURVES_NAME} is drawn instead', flush=True)
        return contextlib.nullcontext(None)
    purge_step = record.begin_epoch if record.resume_path is not None else None
    return summary_writer(opt.result_path, purge_step)


# The hyper-parameters TensorBoard's HParams tab shows beside the final metrics.
HPARAM_OPTIONS = ('arch', 'dataset', 'optimizer', 'lr_scheduler', 'learning_rate', 'batch_size',
                  'accumulation_steps', 'n_epochs', 'weight_decay', 'momentum', 'label_smoothing',
                  'mixup_alpha', 'cutmix_alpha', 'ema_decay', 'sample_size', 'sample_duration',
                  'ft_begin_module')


def write_hparams(writer, opt, world_size, epoch, train_stats, val_stats=None):
    """The run's hyper-parameters (HPARAM_OPTIONS, and the process count) with
    its final metrics (hparams/train_loss, train_acc, and with validation
    val_loss, val_acc (video), val_clip_acc), at step `epoch`, as add_hparams
    writes them but in this run's own event file."""
    from torch.utils.tensorboard.summary import hparams
    values = {key: getattr(opt, key) for key in HPARAM_OPTIONS} | {'world_size': world_size}
    metrics = {'hparams/train_loss': train_stats['loss'], 'hparams/train_acc': train_stats['acc']}
    if val_stats:
        metrics.update({'hparams/val_loss': val_stats['loss'], 'hparams/val_acc': val_stats['acc'],
                        'hparams/val_clip_acc': val_stats['clip_acc']})
    for summary in hparams(values, metrics):
        writer.file_writer.add_summary(summary, epoch)
    for key, value in metrics.items():
        writer.add_scalar(key, value, epoch)
    writer.flush()


# Lines that may coincide (a validation video accuracy equal to the clip one) keep
# apart by style: the later one dashed, with open markers, over the earlier.
_STYLES = [dict(linestyle='-', marker='o'), dict(linestyle='--', marker='s', markerfacecolor='none'),
           dict(linestyle=':', marker='^', markerfacecolor='none')]


def curves_figure(result_path):
    """(figure, series drawn {name: [(epoch, value)]}) of the training and
    validation loss, their accuracies and the learning rate against the epoch,
    from train.log and val.log. The loss panel is on a log scale: an early
    validation loss of 55 (the demo's first epoch) or a spike of 6000 would
    flatten the rest of the run at zero on a linear one."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    result_path = Path(result_path)
    train, val = ([row for row in read_tsv(result_path / name) if row.get('epoch')]
                  if (result_path / name).is_file() else [] for name in ('train.log', 'val.log'))
    panels = {'loss': [('train', train, 'loss'), ('validation', val, 'loss')],
              'accuracy': [('train (clip)', train, 'acc'), ('validation (video)', val, 'acc'),
                           ('validation (clip)', val, 'clip_acc')],
              'learning rate': [('lr', train, 'lr')]}
    fig = Figure(figsize=(13, 3.8), dpi=100, layout='constrained')
    drawn = {}
    for ax, (title, lines) in zip(fig.subplots(1, 3), panels.items()):
        for (label, rows, column), style in zip(lines, _STYLES):
            points = [(int(r['epoch']), float(r[column])) for r in rows if r.get(column)]
            if points:
                ax.plot(*zip(*points), markersize=4, label=label, **style)
                drawn[f'{title}: {label}'] = points
        values = [v for name, points in drawn.items() if name.startswith(f'{title}:') for _, v in points]
        if title == 'loss' and values and min(values) > 0:
            ax.set_yscale('log')
            title = 'loss (log scale)'
        ax.set_title(title)
        ax.set_xlabel('epoch')
        ax.legend(fontsize=8)
    return fig, drawn


def draw_curves(result_path):
    """CURVES_NAME in result_path, curves_figure's picture (drawn after every
    epoch when TensorBoard is off; replaced atomically). Returns the series drawn."""
    fig, drawn = curves_figure(result_path)
    with atomic_path(Path(result_path) / CURVES_NAME) as tmp:
        fig.savefig(tmp, format='png')
    return drawn


def drawing_command(result_path) -> list[str]:
    """The command that draws CURVES_NAME in a process of its own: it imports
    this module and matplotlib only, not torch or the run's data."""
    root = str(Path(__file__).resolve().parents[1])
    return [sys.executable, '-c', 'import sys; sys.path.insert(0, sys.argv[1]); '
            'from utils.logs import draw_curves; draw_curves(sys.argv[2])', root, str(result_path)]


class CurvesPainter:
    """Redraws CURVES_NAME after every epoch without holding the next one up:
    matplotlib takes 0.5-2 s a drawing, most of a short epoch. One drawing runs
    at a time in a child process; an epoch that ends while one runs asks for
    another, started when that one is done. Closing waits for the last drawing,
    so the file shows the whole run at its end."""

    def __init__(self, result_path):
        self.result_path = Path(result_path).resolve()
        self.child = None
        self.pending = False

    def request(self):
        if self.child is not None and self.child.poll() is None:
            self.pending = True
            return
        self._start()

    def _start(self):
        self.pending = False
        self.child = subprocess.Popen(drawing_command(self.result_path), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _wait(self):
        try:
            _, err = self.child.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            self.child.kill()
            _, err = self.child.communicate()
        if self.child.returncode:
            lines = err.decode(errors='replace').strip().splitlines() or ['(no message)']
            print(f'note: drawing {self.result_path / CURVES_NAME} failed: {lines[-1]}', flush=True)

    def close(self):
        if self.child is None:
            return
        self._wait()
        if self.pending:
            self._start()
            self._wait()
        self.child = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def where_curves_are(result_path, writer):
    """The end-of-run line about the curves: the event file and the command
    that shows it (writer: the run's SummaryWriter), or curves.png."""
    result_path = Path(result_path)
    if writer is not None:
        events = max(result_path.glob('events.out.tfevents.*'), key=os.path.getmtime)
        return f'TensorBoard events: {events}; view them with: tensorboard --logdir {result_path}'
    if (result_path / CURVES_NAME).is_file():
        return f'loss, accuracy and learning rate curves: {result_path / CURVES_NAME}'
    return None
