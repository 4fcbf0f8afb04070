"""The README is an entry page and the manuals live in docs/: every relative
link (and #anchor, by GitHub's heading slugs) in README.md and docs/*.md
resolves, every page is reachable from the README, and the README stays short."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / 'README.md'] + sorted((ROOT / 'docs').glob('*.md'))
README_MAX_LINES = 300
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
