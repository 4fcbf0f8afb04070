"""The README is an entry page and the manuals live in docs/: every relative
link (and #anchor, by GitHub's heading slugs) in README.md and docs/*.md
resolves, every page is reachable from the README, the README stays short, and
every option its commands give is one their program takes (checked by -h)."""
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / 'README.md'] + sorted((ROOT / 'docs').glob('*.md'))
README_MAX_LINES = 150
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def prose_lines(text):
    """The lines outside ``` fences, with inline code removed."""
    inside = False
    for line in text.splitlines():
        if line.lstrip().startswith('```'):
            inside = not inside
            continue
        if not inside:
            yield re.sub(r'`[^`]*`', '', line), line


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation
    dropped (letters, digits, '-', '_' and spaces kept), spaces to '-'."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading).replace('`', '')
    text = ''.join(c for c in text.lower() if c.isalnum() or c in '-_ ')
    return text.replace(' ', '-')


def anchors(path):
    """Every heading's anchor in a page, with GitHub's -1, -2 for repeats."""
    seen = {}
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            yield base if n == 0 else f'{base}-{n}'


def links(path):
    for stripped, _ in prose_lines(path.read_text()):
        for target in LINK.findall(stripped):
            if not re.match(r'[a-z]+:', target):
                yield target


def test_slug_follows_github():
    assert slug('What can go wrong → what you see') == 'what-can-go-wrong--what-you-see'
    assert slug('Training recipe: regularizers, EMA weights') == 'training-recipe-regularizers-ema-weights'
    assert slug('`--file_type video` (from files)') == '--file_type-video-from-files'


def test_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('# Top\n\n[ok](#top) [bad](#nowhere) [gone](missing.md)\n```\n[code](skipped.md)\n```\n')
    assert list(links(page)) == ['#top', '#nowhere', 'missing.md']
    assert list(anchors(page)) == ['top']


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        file_part, _, anchor = target.partition('#')
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f'{target}: no file {dest.relative_to(ROOT)}')
        elif anchor and dest.suffix == '.md' and anchor not in set(anchors(dest)):
            broken.append(f'{target}: no heading #{anchor} in {dest.relative_to(ROOT)}')
    assert not broken, f'{page.relative_to(ROOT)}: ' + '; '.join(broken)


def test_readme_is_an_entry_page():
    lines = (ROOT / 'README.md').read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f'README.md has {len(lines)} lines: move manuals into docs/'
    linked = {(ROOT / t.partition('#')[0]).resolve() for t in links(ROOT / 'README.md') if t.partition('#')[0]}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f'docs pages the README does not link: {unlinked}'


def test_no_pointer_to_a_missing_data_formats_page():
    """Code comments once named a data_formats.md that was never in the repository."""
    here = Path(__file__).resolve()
    hits = [str(p.relative_to(ROOT)) for p in ROOT.rglob('*.py')
            if p.resolve() != here and not {'.venv', 'venv', '.git'} & set(p.parts)
            and 'data_formats.md' in p.read_text(errors='replace')]
    assert not hits, f'these name data_formats.md: point them at docs/data.md instead: {hits}'


def readme_commands(text):
    """The commands of the README's bash blocks, continuation lines joined, each
    split at '&&' and '|'; comments dropped."""
    blocks = re.findall(r'```bash\n(.*?)```', text, re.S)
    joined = '\n'.join(blocks).replace('\\\n', ' ')
    for line in joined.splitlines():
        line = line.split('#', 1)[0].strip() if not line.lstrip().startswith('#') else ''
        for part in re.split(r'&&|\|', line):
            if part.strip():
                yield part.strip()


def program_of(command):
    """(the -h command of the program a README command runs, its own arguments)."""
    words = command.split()
    if words[0] == 'torchrun':
        script = next(i for i, w in enumerate(words) if w.endswith('.py'))
        return [sys.executable, words[script], '-h'], words[script + 1:]
    if words[:2] == ['python', '-m']:
        return [sys.executable, '-m', words[2], '-h'], words[3:]
    if words[0] == 'python':
        return [sys.executable, words[1], '-h'], words[2:]
    if words[0] == 'pip':
        return [sys.executable, '-m', 'pip', words[1], '-h'], words[2:]
    if words[0] == 'tensorboard':
        return [sys.executable, '-m', 'tensorboard.main', '--helpfull'], words[1:]
    raise AssertionError(f'the README runs a program this test does not know: {command}')


@functools.lru_cache(maxsize=None)
def help_text(argv):
    proc = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f'{" ".join(argv)} failed: {proc.stderr[-500:]}'
    return proc.stdout


def test_readme_commands_find_what_they_need():
    text = (ROOT / 'README.md').read_text()
    commands = list(readme_commands(text))
    assert any(c.startswith('python main.py --dataset synthetic') for c in commands)
    assert any(c.startswith('python -m pytest') for c in commands)
    for command in commands:
        if command.startswith('python -m pytest'):
            continue  # the suite itself
        argv, args = program_of(command)
        given = [a.split('=')[0] for a in args if a.startswith('--')]
        known = help_text(tuple(argv))
        missing = [o for o in given if not re.search(rf'(?<![\w-]){re.escape(o)}(?![\w-])', known)]
        assert not missing, f'{command}: {argv[1:-1]} takes no {missing}'
        for path in (a for a in args if a.endswith('.py') and not a.startswith('-')):
            assert (ROOT / path).is_file(), f'{command}: no {path}'


def test_the_readme_check_sees_an_unknown_option():
    argv, args = program_of('python predict.py model.pth --no_such_option 3')
    assert '--no_such_option' not in help_text(tuple(argv)) and args[1] == '--no_such_option'
