"""Build the Moments in Time annotation JSON.

python -m util_scripts.mit_json mit_dir_path video_path dst_path

mit_dir_path holds moments_categories.txt ("name,index" lines),
trainingSet.csv and validationSet.csv ("<class>/<file>.mp4,<class>,...")
and optionally testingSet.csv ("<file>.mp4"). Video ids are the file stems.
dst_path is the JSON file to write (an existing directory gets mit.json).
"""
import csv
from pathlib import Path

from .utils import (
    add_segments,
    builder_parser,
    fail,
    require_dir,
    require_file,
    require_known_labels,
    require_video_root,
    write_annotation,
)


def load_labels(categories_path):
    """Class names ordered by the index column (file order without one)."""
    with open(categories_path, newline='', encoding='utf-8-sig') as f:
        rows = [r for r in csv.reader(f) if r and r[0].strip()]
    try:
        indexed = [(int(r[1]) if len(r) > 1 else i, r[0].strip())
                   for i, r in enumerate(rows)]
    except ValueError:
        fail(f'{categories_path}: expected "<class>,<index>" lines')
    return [name for _, name in sorted(indexed)]


def load_subset(csv_path, subset):
    database = {}
    with open(csv_path, newline='', encoding='utf-8-sig') as f:
        for row in csv.reader(f):
            if not row or not row[0].strip():
                continue
            path = Path(row[0].strip())
            if subset == 'testing':
                annotations = {}
            else:
                # The label column names the class; the path's folder is
                # the same name and serves when the column is absent.
                label = row[1].strip() if len(row) > 1 else path.parent.name
                if not label:
                    fail(f'{csv_path}: no class for {row[0]!r}')
                annotations = {'label': label}
            database[path.stem] = {'subset': subset,
                                   'annotations': annotations}
    return database


def main(argv=None):
    parser = builder_parser(
        'Write the Moments in Time annotation JSON from the official CSV files and the '
        'extracted frames.', 'mit_dir_path',
        'directory with moments_categories.txt, trainingSet.csv, validationSet.csv '
        '(testingSet.csv optional)', 'JSON file to write')
    args = parser.parse_args(argv)

    d = require_dir(args.mit_dir_path, 'Moments in Time annotation directory')
    hint = 'give the directory of the official MiT annotation files'
    categories = require_file(d / 'moments_categories.txt',
                              'moments_categories.txt', hint)
    train = require_file(d / 'trainingSet.csv', 'trainingSet.csv', hint)
    val = require_file(d / 'validationSet.csv', 'validationSet.csv', hint)
    require_video_root(args.video_path)

    labels = load_labels(categories)
    database = load_subset(train, 'training')
    database.update(load_subset(val, 'validation'))
    require_known_labels(database, labels,
                         f'the CSV files use classes absent from {categories}')
    if (d / 'testingSet.csv').is_file():
        database.update(load_subset(d / 'testingSet.csv', 'testing'))
    add_segments(database, args.video_path)

    dst = args.dst_path / 'mit.json' if args.dst_path.is_dir() \
        else args.dst_path
    write_annotation(dst, labels, database)


if __name__ == '__main__':
    main()
