"""Build a Kinetics annotation JSON from the official CSV files.

python -m util_scripts.kinetics_json train_csv val_csv test_csv video_path {jpg,hdf5,video} dst_json
python -m util_scripts.kinetics_json csv_dir n_classes video_path {jpg,hdf5,video} dst_json

The second form is the predecessor's: the CSVs are
csv_dir/kinetics-<n_classes>_{train,val,test}.csv. The test CSV is optional
(a path that does not exist gives no testing subset). CSV columns:
label,youtube_id,time_start,time_end,split[,is_cc]; the test CSV has no label.
Video ids are <youtube_id>_<start:06d>_<end:06d>; frames (or, with video,
the video files <id>.mp4/.avi/.webm/.mkv, for --file_type video) are looked
up under video_path/<label>/ (test videos under video_path/test/), and videos
not on disk are left out.
"""
import csv
from pathlib import Path

from utils.cli import Parser

from .utils import (
    VIDEO_TYPES,
    add_segments,
    fail,
    require_file,
    require_video_root,
    write_annotation,
)

USAGE = ('%(prog)s train_csv val_csv test_csv video_path {jpg,hdf5,video} '
         'dst_json\n       %(prog)s csv_dir n_classes video_path '
         '{jpg,hdf5,video} dst_json   (predecessor form)')


def read_rows(csv_path, need_label):
    with open(csv_path, newline='', encoding='utf-8-sig') as f:
        reader = csv.DictReader(f)
        columns = set(reader.fieldnames or ())
        need = {'youtube_id', 'time_start', 'time_end'} | (
            {'label'} if need_label else set())
        if not need <= columns:
            fail(f'{csv_path}: missing column(s) '
                 f'{", ".join(sorted(need - columns))}; found '
                 f'{", ".join(sorted(columns)) or "none"}')
        return list(reader)


def video_id(row):
    # Times may come as "10" or "10.0" depending on who wrote the CSV.
    start = int(float(row['time_start']))
    end = int(float(row['time_end']))
    return f'{row["youtube_id"]}_{start:06d}_{end:06d}'


def load_subset(csv_path, subset):
    labelled = subset != 'testing'
    database = {}
    for line, row in enumerate(read_rows(csv_path, labelled), 2):
        try:
            key = video_id(row)
        except (TypeError, ValueError):
            fail(f'{csv_path} line {line}: bad time_start/time_end in '
                 f'{row}')
        annotations = {'label': row['label']} if labelled else {}
        database[key] = {'subset': subset, 'annotations': annotations}
    return database


def convert(train_csv, val_csv, test_csv, video_path, video_type):
    database = load_subset(train_csv, 'training')
    # Class ids are the sorted class names; the official CSVs list the
    # classes in that order, so this matches the published models.
    labels = sorted({v['annotations']['label'] for v in database.values()})
    val = load_subset(val_csv, 'validation')
    unknown = sorted({v['annotations']['label'] for v in val.values()} -
                     set(labels))
    if unknown:
        fail(f'{val_csv} has classes absent from {train_csv}: '
             f'{", ".join(unknown[:5])}')
    database.update(val)
    if test_csv is not None and Path(test_csv).is_file():
        database.update(load_subset(test_csv, 'testing'))
    else:
        print(f'note: test CSV {test_csv} not found; no testing subset')
    listed = len(database)
    dropped = add_segments(database, video_path, video_type)
    print(f'{listed - dropped} of {listed} listed videos found on disk '
          f'({dropped} skipped)')
    return labels, database


def parse_args(argv):
    parser = Parser(
        usage=USAGE,
        description='Write a Kinetics annotation JSON from the official CSV '
        'files and the extracted frames (jpg folders or hdf5 files).')
    parser.add_argument('args', nargs='+', metavar='ARG',
                        help='see usage; video type jpg gives 1-based '
                        'segments [1, n+1], hdf5 and video 0-based [0, n]')
    args = parser.parse_args(argv).args
    if len(args) == 6:
        train, val, test, video_path, video_type, dst = args
    elif len(args) == 5 and args[1].isdigit():
        csv_dir, n_classes, video_path, video_type, dst = args
        train, val, test = (
            str(Path(csv_dir) / f'kinetics-{n_classes}_{split}.csv')
            for split in ('train', 'val', 'test'))
    else:
        parser.error(f'expected 6 arguments (or the predecessor\'s 5), '
                     f'got {len(args)}: {" ".join(args)}')
    if video_type not in VIDEO_TYPES:
        parser.error(f'video_type must be one of {", ".join(VIDEO_TYPES)}, '
                     f'got {video_type!r}')
    return (Path(train), Path(val), Path(test), Path(video_path), video_type,
            Path(dst))


def main(argv=None):
    train, val, test, video_path, video_type, dst = parse_args(argv)
    hint = 'the official kinetics CSV (label,youtube_id,time_start,...)'
    require_file(train, 'training CSV', hint)
    require_file(val, 'validation CSV', hint)
    require_video_root(video_path)
    labels, database = convert(train, val, test, video_path, video_type)
    write_annotation(dst, labels, database)


if __name__ == '__main__':
    main()
