"""The repository explains itself: its code and docs point to no file outside it, and every seed
paper the code cites ("seed 000", ...) is listed with its title in docs/papers.md."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("DESIGN.md", "../shared", "shared/seeds", "shared/specs")


def project_files():
    for folder in ("src", "docs", "benchmarks"):
        yield from (p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".sh", ".json", ".toml")
                    and ".egg-info" not in str(p))
    yield ROOT / "README.md"
    yield ROOT / "pyproject.toml"


def test_no_code_or_doc_points_outside_the_repository():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in project_files()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if any(ref in line for ref in OUTSIDE)]
    assert hits == [], "\n".join(hits[:20])


def test_citations_name_the_papers_not_the_digests_outside_the_repository():
    """"spec-002 §1.3" named a digest of a paper that only the developers have; the code cites the
    paper's own section ("seed 002 §2.1"), and seed 002's and seed 004's §1 (their introductions,
    without numbered subsections) are never cited as "§1.x"."""
    digest = re.compile(r"\bspec-\d{3}|\bspec §|seed 00[24] §1\.\d")
    tests = (ROOT / "tests").glob("*.py")
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in (*project_files(), *tests)
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if digest.search(line) and p.name != "test_self_contained.py"]
    assert hits == [], "\n".join(hits[:20])


def test_every_cited_seed_paper_is_listed_with_its_title():
    cited = {m for p in (ROOT / "src").rglob("*.py") for m in re.findall(r"[Ss]eed (?:paper )?(00\d)\b", p.read_text())}
    listed = dict(re.findall(r"^\| (00\d) \| \*(.+?)\*", (ROOT / "docs" / "papers.md").read_text(), flags=re.M))
    assert cited and cited <= set(listed), sorted(cited - set(listed))
    assert all(len(title) > 20 for title in listed.values())
