"""MkDocs hooks: README.md as the site's front page and results/ inside the site, links kept valid in both.

On GitHub the front page is README.md at the top, the pages are docs/*.md, and results/ sits
beside them; links are written for that layout (README: `docs/x.md`, `results/...`; a page:
`../README.md`, `../results/...`). Here README.md becomes index.md and results/ is copied under
the site's root (its large data files aside), and the links are rewritten to match, so
`mkdocs build --strict` checks every one of them.
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 2_000_000  # nothing a reader opens in a browser is larger


def wanted(path: Path) -> bool:
    """results/ but its data: the per-step tables (metrics.*), run directories, large files."""
    return (path.is_file() and path.stem != "metrics" and "runs" not in path.relative_to(ROOT).parts
            and path.stat().st_size <= MAX_BYTES)


def on_files(files, config):
    files.append(File.generated(config, "index.md", abs_src_path=str(ROOT / "README.md")))
    for path in sorted((ROOT / "results").rglob("*")):
        if wanted(path):
            files.append(File.generated(config, path.relative_to(ROOT).as_posix(), abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":  # README.md, written for the top of the repository
        return re.sub(r"\]\(docs/", "](", markdown)
    if "/" not in page.file.src_uri:    # a page of docs/
        return re.sub(r"\]\(\.\./README\.md", "](index.md", re.sub(r"\]\(\.\./results/", "](results/", markdown))
    # a page of results/ linking a page of docs/ (`../docs/statistics.md`): here docs/ is the site's root
    return re.sub(r"\]\(((?:\.\./)+)docs/", r"](\1", markdown)
