"""The docs: README.md as a short front page, docs/ as a MkDocs site that builds with no broken link or page."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
# CI and a hook read these two lines of README.md: they stay as they are
COMMANDS = ["bash scripts/setup.sh && .venv/bin/python -m grpo_bench run ablations/loss_modes.yaml",
            "bash scripts/setup.sh && .venv/bin/python -m pytest"]


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move reference material to docs/"
    for command in COMMANDS:
        assert command in lines


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_page_is_in_the_nav():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert sorted(p for p in nav if "/" not in p and p != "index.md") == [p.name for p in PAGES]
    assert nav[0] == "index.md" and not (ROOT / "docs" / "index.md").exists()   # README.md is the front page


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_work_on_github_too(page):
    """The site checks its links; these are the same links read from the files where they lie."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path = target.split("#")[0]
        if path and not re.match(r"[a-z]+://", path):
            assert (page.parent / path).exists(), f"{page.name}: {target}"


def test_the_site_builds_with_every_link_and_anchor_valid(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    # README.md is the front page, with its figures; the pages and results' reports are there
    assert "What each design choice of GRPO actually does" in (site / "index.html").read_text()
    assert (site / "results" / "loss_modes" / "headline.png").stat().st_size > 0
    assert (site / "results" / "loss_modes" / "REPORT" / "index.html").is_file()
    for page in PAGES:
        assert (site / page.stem / "index.html").is_file(), page.name
    # results' per-step tables stay out of the site
    assert not list(site.rglob("metrics.*"))


def test_files_map_covers_the_tree():
    """docs/files.md names every tracked file (or a folder holding it), and nothing that is gone."""
    import subprocess

    text = (ROOT / "docs" / "files.md").read_text()
    listed = set(re.findall(r"^(\S+)\s", text, re.M)) - {"#", "```"}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")

    def covered(f: str) -> bool:
        parts = f.split("/")
        return f in listed or any("/".join(parts[:i]) + "/" in listed for i in range(1, len(parts)))

    missing = [f for f in tracked if not f.startswith("results/") and not covered(f)]
    assert not missing, f"docs/files.md lacks: {missing}"
    gone = [p for p in listed if "<" not in p and not any(f == p or f.startswith(p.rstrip("/") + "/") for f in tracked)]
    assert not gone, f"docs/files.md names what is not in the tree: {gone}"


def test_the_tracked_results_stay_light():
    """What a clone checks out of results/ stays under 24 MB (it was 37 MB of figures and tables stored
    plainly; 20 MB until the starts' replications, about 0.22 MB each, 21 MB until spell_backward_slow's
    four sweeps, 22 MB until sampler_mismatch's countdown rerun, 23 MB until SmolLM2's first GPU sweeps);
    docs/storage.md says how."""
    tracked = subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split("\0")
    files = [ROOT / f for f in tracked if f and (ROOT / f).is_file()]
    if not files:
        pytest.skip("not a git checkout")
    size = sum(f.stat().st_size for f in files)
    biggest = sorted(files, key=lambda f: -f.stat().st_size)[:3]
    assert size < 24e6, (f"tracked results/ is {size / 1e6:.1f} MB, the budget 24 MB; largest: "
                         + ", ".join(f"{f.relative_to(ROOT)} ({f.stat().st_size / 1e6:.2f} MB)" for f in biggest))


def test_paths_named_in_the_package_exist():
    """A docstring or comment that sends the reader to a file of the repository names one that is there
    (algos/__init__ once linked a file that never was): paths from the repository root, globs left out."""
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    folders = {str(Path(f).parent) for f in tracked} | {str(Path(f).parent.parent) for f in tracked}
    missing = []
    for p in sorted((ROOT / "grpo_bench").rglob("*.py")):
        text = p.read_text()
        for m in re.finditer(r"(?<![\w./<-])((?:grpo_bench|docs|results|tasks|scripts|tests|ablations|examples)"
                             r"/[\w./-]*\w)(?![\w*<])", text):
            t = m.group(1)
            if t not in tracked and t not in folders and not (ROOT / t).exists():
                missing.append(f"{p.relative_to(ROOT)}: {t}")
    assert not missing, missing
