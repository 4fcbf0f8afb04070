"""Video accuracy of an inference result file: top-1, top-5, mean class accuracy,
a per-class report and a confusion-matrix picture.

python -m util_scripts.eval_accuracy GT_JSON RESULT_JSON [-k 1] [--subset validation] [--save]
    [--ignore] [--report] [--confusion PATH.png]

GT_JSON is an annotation JSON (docs/data.md, File formats); RESULT_JSON is what
inference writes: {"results": {video_id: [{"label", "score"}, ...]}}, or the
per-clip form {"results": {video_id: [{"segment", "result": [...]}, ...]}},
whose scores are averaged over the clips of each video first. Every
labelled video of the subset counts; one without a result counts as wrong
unless --ignore restricts the evaluation to the videos in the results; how
many had none, and how they were counted, is printed under the accuracy and
written to top<k>.json with --save.
Top-k needs k labels per video: from a file that ranks fewer (inference's
--output_topk 3, say) the largest top-k it holds is printed instead, with a
note.
"""
import argparse
import json
from pathlib import Path

from datasets.video_accuracy import canonical_subset, evaluate_file
from utils.atomic import write_atomic
from utils.metrics import format_report, save_confusion_png


def main(argv=None):
    parser = argparse.ArgumentParser(
        description='Top-k video accuracy of an inference result JSON.')
    parser.add_argument('ground_truth_path', type=Path, metavar='GT_JSON',
                        help='annotation JSON')
    parser.add_argument('result_path', type=Path, metavar='RESULT_JSON',
                        help='inference output (<result_path>/<subset>.json)')
    parser.add_argument('-k', type=int, default=1, help='top-k (default 1)')
    parser.add_argument('--subset', default='validation',
                        help='training, validation or testing (also train, '
                        'val, test); default validation')
    parser.add_argument('--save', action='store_true',
                        help='write the accuracy to top<k>.txt next to '
                        'RESULT_JSON')
    parser.add_argument('--ignore', action='store_true',
                        help='evaluate only the videos present in the '
                        'results (default: missing videos count as wrong)')
    parser.add_argument('--report', action='store_true',
                        help='print per-class precision, recall, F1 and support')
    parser.add_argument('--confusion', type=Path, default=None, metavar='PATH.png',
                        help='draw the row-normalized confusion matrix to this PNG')
    args = parser.parse_args(argv)

    try:
        evaluation = evaluate_file(args.ground_truth_path, args.result_path, args.subset,
                                   args.ignore, ks=(1, args.k, 5))
    except (OSError, ValueError) as e:
        raise SystemExit(f'error: {e}')
    accuracy = evaluation.topk(args.k)
    print('\n'.join(evaluation.summary_lines()))
    missing = missing_line(evaluation, canonical_subset(args.subset), args.ignore)
    if missing:
        print(missing)
    if args.report:
        print('\n' + format_report(evaluation.report, evaluation.class_names))
    if args.confusion is not None:
        save_confusion_png(evaluation.confusion, evaluation.class_names, args.confusion)
        print(f'confusion matrix: {args.confusion}')
    if args.save:
        if accuracy is None:
            raise SystemExit(f'error: top-{args.k} accuracy: {evaluation.why_not(args.k)}; '
                             f'nothing written')
        # Same content as the predecessor's file: the bare accuracy; the counts beside it.
        write_atomic(args.result_path.parent / f'top{args.k}.txt', str(accuracy))
        counts = {'k': args.k, 'accuracy': accuracy, 'hits': evaluation.topk_hits[args.k],
                  'videos': evaluation.n_videos, 'videos_without_result': evaluation.n_missing,
                  'without_result_counted': 'left out (--ignore)' if args.ignore else 'as wrong',
                  'note': missing}
        write_atomic(args.result_path.parent / f'top{args.k}.json', json.dumps(counts, indent=1) + '\n')
    return accuracy


def missing_line(evaluation, subset, ignore):
    """The note on the labelled videos that have no result (None: every one has)."""
    n = evaluation.n_missing
    if not n:
        return None
    if ignore:
        total = evaluation.n_videos + n
        return (f'note: {n} of the {total} \'{subset}\' videos have no result: left out (--ignore); '
                f'the accuracy is over the {evaluation.n_videos} with one')
    return (f'note: {n} of the {evaluation.n_videos} \'{subset}\' videos have no result: counted as '
            f'wrong (--ignore evaluates the {evaluation.n_videos - n} with a result only)')


if __name__ == '__main__':
    main()
