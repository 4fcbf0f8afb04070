"""Tab-separated logs with 3D-ResNets-PyTorch's file names and columns."""
import csv
import os
from pathlib import Path


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
