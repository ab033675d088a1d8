"""The README stays short and the documentation's links hold (issue 22, item 8).

README.md is what a newcomer reads first, so it stays under 10 KB and leaves the reference material to
`docs/`: every `docs/*.md` page (and each program's generated `docs/reference/*.md`) is linked from it, and
every relative link in README.md and in those pages reaches a file of the repository and, with a
`#fragment`, a heading of that file. Anchors are made as GitHub makes them from a heading's text
(lowercased, punctuation dropped, spaces as hyphens, `-1`, `-2` for repeats), so a renamed heading breaks
the links to it here rather than on the rendered page.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_LIMIT = 10 * 1024

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _without_code(text: str) -> str:
    """Markdown text without fenced blocks and inline code, where brackets and `#` lines are not markup."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lowercased, only word characters, hyphens and
    spaces kept, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a Markdown text give, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(text: str) -> list[str]:
    """The targets of a Markdown text's links that stay in the repository (no scheme such as https:)."""
    return [target for target in LINK.findall(_without_code(text)) if not SCHEME.match(target)]


def link_problems(page: Path, root: Path) -> list[str]:
    """What is wrong with each relative link of `page`: a missing file, a file outside `root`, or a
    `#fragment` naming no heading of the Markdown file it points at."""
    problems = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page.resolve()
        where = f"{page.relative_to(root)}: ({target})"
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{where} leaves the repository")
        elif not dest.exists():
            problems.append(f"{where} names no file")
        elif fragment and (dest.suffix != ".md" or fragment not in anchors(dest.read_text(encoding="utf-8"))):
            problems.append(f"{where} names no heading of {dest.name}")
    return problems


def test_readme_is_under_ten_kilobytes() -> None:
    size = len(README.read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes; move reference material to docs/"


def docs_pages() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), *sorted((DOCS / "reference").glob("*.md"))]


def test_every_relative_link_of_the_readme_and_the_docs_reaches_a_file_and_heading() -> None:
    pages = [README, *docs_pages()]
    problems = [problem for page in pages for problem in link_problems(page, REPO)]
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / target.partition("#")[0]).resolve() for target in relative_links(README.read_text())}
    unlinked = [str(page.relative_to(DOCS)) for page in docs_pages() if page.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_anchors_follow_githubs_rules() -> None:
    text = (
        "# The fast path: install-cni answers the plugin (not upstream)\n"
        "## What `make run` builds\n"
        "### The local node's VM (`node/vm.py`, `LocalNode.add_vm`)\n"
        "## `--check`\n"
        "## Not upstream\n"
        "```yaml\n# a comment, not a heading\n```\n"
        "### Not upstream\n"
    )
    assert anchors(text) == {
        "the-fast-path-install-cni-answers-the-plugin-not-upstream",
        "what-make-run-builds",
        "the-local-nodes-vm-nodevmpy-localnodeadd_vm",
        "--check",
        "not-upstream",
        "not-upstream-1",
    }


def test_broken_links_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A page\n## Its part\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/A.md) [ok](docs/A.md#its-part) [ok](#top) [web](https://example.com/x.md)\n"
        "`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n"
        "[gone](docs/B.md) [bad anchor](docs/A.md#nothing) [outside](../elsewhere.md)\n# Top\n"
    )
    problems = link_problems(page, tmp_path)
    assert [p.split(" ", 1)[1] for p in problems] == [
        "(docs/B.md) names no file",
        "(docs/A.md#nothing) names no heading of A.md",
        "(../elsewhere.md) leaves the repository",
    ]
