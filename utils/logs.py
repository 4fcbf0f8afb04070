"""Tab-separated logs with 3D-ResNets-PyTorch's file names and columns."""
import csv
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
