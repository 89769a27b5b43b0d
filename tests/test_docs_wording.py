"""The documentation speaks of the software, its versions and machines, not of how or when a
page was made (issue 63: "this session had none left", "this session's first commit")."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
NARRATION = re.compile(
    r"\bthis (session|turn)\b|had none left|stale test was mended"
    r"|runs were made before|uncommitted changes?\)? (was|were|only)"
    r"|earlier in the session",
    re.IGNORECASE,
)


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: p.name)
def test_no_page_tells_how_it_was_made(page):
    text = " ".join(page.read_text(encoding="utf-8").split())
    assert NARRATION.findall(text) == [], page
