"""The argument parser of every command line: options spelt out in full
(allow_abbrev off: '--n_epoch 1' is not taken as --n_epochs), and each error
in one line on stderr, exit status 2 -- a misspelt option with the option it
most likely means -- instead of the whole usage above it. Standard library
only: a command answers before torch is imported."""
import argparse
import difflib
import re
import sys

_NUMBER = re.compile(r'^-\d+$|^-\d*\.\d+$')  # '-1', '-.5': values, not options


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault('allow_abbrev', False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        unknown = self.unknown_option(args)
        if unknown is not None:
            self.error(unknown)
        return super().parse_known_args(args, namespace)

    def unknown_option(self, args):
        """The message for the first option in args this parser does not know
        (before '--'), or None. Checked before parsing, so that a misspelt option
        is what is reported, not a value it left for a positional argument."""
        for arg in args:
            if arg == '--':
                return None
            if not arg.startswith('-') or arg == '-' or _NUMBER.match(arg):
                continue
            name = arg.split('=', 1)[0]
            if name not in self._option_string_actions:
                return f'unrecognized option {name}{did_you_mean(name, self._option_string_actions)}'
        return None

    def error(self, message):
        print(f'error: {message} ({self.prog} -h lists every option)', file=sys.stderr, flush=True)
        sys.exit(2)


def did_you_mean(name, known):
    """': did you mean --x?' for the closest of the known option strings, or ''."""
    close = difflib.get_close_matches(name, [k for k in known if k.startswith('--')], n=1, cutoff=0.6)
    return f': did you mean {close[0]}?' if close else ''
