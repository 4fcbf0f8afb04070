"""Build an annotation JSON from a folder tree of your own videos.

python -m util_scripts.folder_json ROOT OUT.json [--val_fraction 0.2] [--test_fraction 0]
    [--seed 0] [--splits DIR [--split N]] [--file_type jpg|hdf5|video] [--labels_from CHECKPOINT]

ROOT holds one folder per class: ROOT/<class>/<video>.mp4 (any container the
video loader reads), ROOT/<class>/<video>/image_00001.jpg ... (frames written
by generate_video_jpgs) or ROOT/<class>/<video>.hdf5. The file is in the
predecessor's format (docs/data.md, File formats): labels are the class folders, sorted
(--labels_from CHECKPOINT: the checkpoint's class names in its order, so that a
resumed run keeps each class's label; a folder it lacks is refused);
frame counts are taken as the other builders take them (jpg: 1-based [1, n+1],
hdf5 and video files: 0-based [0, n]); videos that cannot be read are listed
and left out.

Without --splits each class is split on its own (stratified): its videos,
sorted by name, are shuffled by a generator seeded with --seed and the class
name, and the first round(n * fraction) go to validation (and testing). Every
class keeps at least one training video, so a re-run on the same tree gives
the same split, and adding a class leaves the others' splits as they were.
--splits DIR takes UCF-style list files instead: DIR/trainlist0N.txt and
DIR/testlist0N.txt, lines "<class>/<video>.<ext> [index]".

Video ids are the file (or frame folder) names without extension; a name
that occurs in two classes becomes "<class>/<name>", with the entry's
"video_path" pointing at its file.
"""
import argparse
import random
import sys
from pathlib import Path

from datasets.formats import FILE_TYPES, VIDEO_EXTENSIONS, video_files, video_kind
from utils.cli import Parser
from utils.errors import DataError

from .utils import (
    COUNT_SOURCES,
    fail,
    parallel_map,
    print_problems,
    read_lines,
    require_dir,
    require_file,
    video_segment,
    write_annotation,
)


def scan_tree(root):
    """{kind: {(class, name): path}} of the videos under root/<class>/, and
    the entries that are no video (relative paths)."""
    extensions = VIDEO_EXTENSIONS
    found = {kind: {} for kind in FILE_TYPES}
    ignored = [p.name for p in sorted(root.iterdir())
               if p.is_file() and not p.name.startswith('.')]
    classes = [d for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith('.')]
    for folder in classes:
        try:
            video_files(folder)  # two videos of one name: refused, as the loader refuses them
        except DataError as e:
            fail(str(e))
        entries = sorted(folder.iterdir(), key=lambda p: (
            extensions.index(p.suffix.lower()) if p.suffix.lower() in extensions else -1,
            p.name))
        for entry in entries:
            if entry.name.startswith('.'):  # also macOS '._x.mp4' resource forks
                continue
            kind = video_kind(entry, hdf5_suffixes=('.hdf5',))  # the loaders read <id>.hdf5
            key = (folder.name, entry.stem if kind != 'jpg' else entry.name)
            if kind is None or key in found[kind]:
                ignored.append(f'{folder.name}/{entry.name}')
            else:
                found[kind][key] = entry
    return found, ignored


def choose_kind(found, root, file_type):
    """The one kind of video the tree holds (or --file_type among several)."""
    present = {kind: len(videos) for kind, videos in found.items() if videos}
    if file_type is not None:
        if file_type not in present:
            fail(f'{root} holds no {file_type} video under <class>/ (found: '
                 f'{", ".join(f"{n} {k}" for k, n in present.items()) or "none"})')
        return file_type
    if not present:
        fail(f'{root} holds no video: expected <class>/<video>.mp4 (or '
             f'{", ".join(VIDEO_EXTENSIONS[1:])}), <class>/<video>/image_00001.jpg or '
             f'<class>/<video>.hdf5')
    if len(present) > 1:
        fail(f'{root} holds {" and ".join(f"{n} {k}" for k, n in present.items())} videos: '
             f'--file_type trains on one kind, choose it with --file_type')
    return next(iter(present))


def measure(root, videos, kind):
    """{(class, name): segment} of the videos that can be used; the others are
    listed on stderr as the other builders list them."""
    listings = {str(root / label): video_files(root / label)  # one listing per class
                for label in {label for label, _ in videos}} if kind == 'video' else None

    def one(item):
        (label, name), _ = item
        return (label, name, *video_segment(str(root), label, name, kind, listings))

    segments, problems, counted = {}, {}, {}
    for label, name, segment, problem, how in parallel_map(one, sorted(videos.items()), -1,
                                                           ordered=True):
        if problem is not None:
            problems.setdefault(problem, []).append(f'{label}/{name}')
        if how is not None:
            counted[how] = counted.get(how, 0) + 1
        if segment is not None:
            segments[(label, name)] = segment
    print_problems(problems, max_listed=10)
    if counted:
        print('frame counts of video files: ' + ', '.join(
            f'{n} {COUNT_SOURCES[how]}' for how, n in sorted(counted.items())))
    if not segments:
        fail(f'none of the {len(videos)} videos under {root} could be read (listed above)')
    return segments


def stratified_split(keys, val_fraction, test_fraction, seed):
    """{(class, name): subset}: per class, shuffled by (seed, class), at least
    one training video; a class of two or more videos gets a validation
    video when val_fraction > 0 (and of three or more a test video)."""
    by_class = {}
    for label, name in sorted(keys):
        by_class.setdefault(label, []).append(name)
    subsets = {}
    for label, names in by_class.items():
        random.Random(f'{seed}/{label}').shuffle(names)
        n = len(names)
        n_val = _share(n, val_fraction, n - 1)
        n_test = _share(n, test_fraction, n - 1 - n_val)
        for i, name in enumerate(names):
            subsets[(label, name)] = ('validation' if i < n_val else
                                      'testing' if i < n_val + n_test else 'training')
    return subsets


def _share(n, fraction, room):
    """round(n * fraction), at least 1 when the fraction is positive, at most room."""
    if fraction <= 0 or room <= 0:
        return 0
    return min(room, max(1, round(n * fraction)))


def list_split(splits_dir, split, keys):
    """{(class, name): subset} from trainlist0N.txt / testlist0N.txt (UCF-style);
    prints what the lists name that is not on disk and what they leave out."""
    subsets = {}
    listed = 0
    for list_name, subset in (('trainlist', 'training'), ('testlist', 'validation')):
        path = require_file(splits_dir / f'{list_name}{split:02d}.txt', f'{list_name} file',
                            f'--splits DIR holds {list_name}{split:02d}.txt (UCF-101 style)')
        for line in read_lines(path):
            parts = line.split()[0].split('/')
            if len(parts) != 2:
                fail(f'{path}: expected "<class>/<video>.<ext>" lines, got {line!r}')
            listed += 1
            subsets[(parts[0], Path(parts[1]).stem)] = subset
    missing = sorted(set(subsets) - set(keys))
    unlisted = sorted(set(keys) - set(subsets))
    for what, names in (('listed but not found or not readable, skipped', missing),
                        ('on disk but in neither list, left out', unlisted)):
        if names:
            shown = ', '.join(f'{c}/{n}' for c, n in names[:10])
            more = f', ... ({len(names) - 10} more)' if len(names) > 10 else ''
            print(f'{len(names)} video(s) {what}: {shown}{more}', file=sys.stderr)
    kept = {key: subset for key, subset in subsets.items() if key in keys}
    if not kept:
        fail(f'none of the {listed} videos of {splits_dir}\'s lists is under the tree '
             f'(<class>/<video> with the same names)')
    return kept


def build_database(segments, subsets, kind, root, labels=None):
    """(labels, database) in the predecessor's format; labels: the given ones
    (--labels_from), or the classes' sorted."""
    counts = {}
    for _, name in subsets:
        counts[name] = counts.get(name, 0) + 1
    labels = sorted({label for label, _ in subsets}) if labels is None else list(labels)
    database = {}
    for label, name in sorted(subsets):
        entry = {'subset': subsets[(label, name)],
                 'annotations': {'label': label, 'segment': segments[(label, name)]}}
        if counts[name] > 1:  # the same name in two classes: the key must differ
            entry['video_path'] = _relative_path(root, label, name, kind)
            database[f'{label}/{name}'] = entry
        else:
            database[name] = entry
    return labels, database


def _relative_path(root, label, name, kind):
    if kind == 'jpg':
        return f'{label}/{name}'
    if kind == 'hdf5':
        return f'{label}/{name}.hdf5'
    found = video_files(root / label).get(name)  # in any case: IMG_0001.MP4
    if found is not None:
        return f'{label}/{found}'
    raise AssertionError(f'{root / label / name}: measured but not found')


def checkpoint_labels(path):
    """The class names a checkpoint of main.py was trained on, in its order."""
    require_file(path, '--labels_from checkpoint', 'a save_<epoch>.pth of the run to resume')
    from utils.checkpoint import load_checkpoint  # imports torch: only for --labels_from
    from utils.errors import CheckpointError
    try:
        checkpoint = load_checkpoint(path)
    except CheckpointError as e:
        fail(str(e))
    names = checkpoint.get('class_names') if isinstance(checkpoint, dict) else None
    if not names:
        fail(f'{path} stores no class names (written before they were saved, or not by main.py): '
             f'--labels_from needs a checkpoint that has them; resume with the annotation it was '
             f'trained on instead')
    return list(names)


def refuse_unknown_classes(videos, labels, root, checkpoint):
    unknown = sorted({label for label, _ in videos} - set(labels))
    if unknown:
        fail(f'{root} has {len(unknown)} class folder(s) that {checkpoint} was not trained on: '
             f'{", ".join(unknown[:5])}{", ..." if len(unknown) > 5 else ""}: move them out of ROOT '
             f'to resume, or build without --labels_from and fine-tune from the checkpoint with '
             f'--pretrain_path')


def warn_classes_without_training(database, labels):
    trained = {e['annotations']['label'] for e in database.values() if e['subset'] == 'training'}
    lacking = [label for label in labels if label not in trained]
    if lacking:
        print(f'warning: {len(lacking)} class(es) have no training video: '
              f'{", ".join(lacking[:10])}', file=sys.stderr)


def parse_args(argv):
    p = Parser(
        description='Write an annotation JSON for a tree ROOT/<class>/<video> of your own '
                    'videos (video files, frame folders or hdf5 files), with a '
                    'deterministic split stratified by class.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('root', type=Path, metavar='ROOT', help='folder with one folder per class')
    p.add_argument('output', type=Path, metavar='OUT.json', help='annotation file to write')
    p.add_argument('--val_fraction', type=float, default=0.2,
                   help='share of each class\'s videos in the validation subset')
    p.add_argument('--test_fraction', type=float, default=0.0,
                   help='share of each class\'s videos in the testing subset (labelled)')
    p.add_argument('--seed', type=int, default=0, help='seed of the split')
    p.add_argument('--splits', type=Path, default=None, metavar='DIR',
                   help='take the split from DIR/trainlist0N.txt and DIR/testlist0N.txt '
                        '(UCF-101 style) instead of drawing one')
    p.add_argument('--split', type=int, default=1, metavar='N', help='N of --splits\' files')
    p.add_argument('--file_type', choices=FILE_TYPES, default=None,
                   help='the kind of video to use when the tree holds several '
                        '(default: the one it holds)')
    p.add_argument('--labels_from', type=Path, default=None, metavar='CHECKPOINT',
                   help='take the labels and their order from this checkpoint\'s class names '
                        '(to resume it with a rebuilt annotation); class folders it lacks are '
                        'refused (default: the class folders, sorted)')
    args = p.parse_args(argv)
    if not (0 <= args.val_fraction < 1 and 0 <= args.test_fraction < 1
            and args.val_fraction + args.test_fraction < 1):
        p.error('--val_fraction and --test_fraction must be in [0, 1) and sum to less than 1')
    return args


def main(argv=None):
    args = parse_args(argv)
    root = require_dir(args.root, 'ROOT', 'give the folder that holds one folder per class')
    found, ignored = scan_tree(root)
    kind = choose_kind(found, root, args.file_type)
    labels = None
    if args.labels_from is not None:
        labels = checkpoint_labels(args.labels_from)
        refuse_unknown_classes(found[kind], labels, root, args.labels_from)
    if ignored:
        shown = ', '.join(ignored[:5]) + (f', ... ({len(ignored) - 5} more)'
                                          if len(ignored) > 5 else '')
        print(f'note: {len(ignored)} entries that are no {kind} video ignored: {shown}',
              file=sys.stderr)
    segments = measure(root, found[kind], kind)
    if args.splits is not None:
        require_dir(args.splits, '--splits', 'the folder of trainlist01.txt and testlist01.txt')
        subsets = list_split(args.splits, args.split, set(segments))
    else:
        subsets = stratified_split(segments, args.val_fraction, args.test_fraction, args.seed)
    labels, database = build_database(segments, subsets, kind, root, labels)
    warn_classes_without_training(database, labels)
    write_annotation(args.output, labels, database)
    print(f'train with --annotation_path {args.output} --video_path {root} --file_type {kind}'
          f' (--dataset kinetics, ucf101, hmdb51 or mit: all read this format)')


if __name__ == '__main__':
    main()
