"""docs/ARCHITECTURE.md stays true and short: every file it names exists, no paragraph, list item or
table cell runs past 15 lines, and it cites nothing outside the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# Where a bare name in a section is looked for (the section's module, the usual roots).
SEARCH = [ROOT, ROOT / "python", ROOT / "cpp" / "src", ROOT / "python" / "revolta", ROOT / "python" / "revolta" / "server", ROOT / "cuda"]
SUFFIXES = (".h", ".cpp", ".cu", ".cuh", ".py", ".md", ".def", ".sh")


def named_files(text: str) -> set[str]:
    names = set()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("```"))
    for quoted in re.findall(r"`([^`\n]+)`", text):
        for word in quoted.split():
            word = word.strip("(),;:")
            if word.endswith(SUFFIXES) and "<" not in word and "*" not in word:
                names.add(word)
    return names


def exists(name: str) -> bool:
    if any((base / name).is_file() for base in SEARCH):
        return True
    # A bare file name: anywhere under cpp/, cuda/, python/, tests/, benchmarks/, tools/.
    return "/" not in name and any(next(ROOT.glob(f"{d}/**/{name}"), None) for d in
                                   ("cpp", "cuda", "python", "tests", "benchmarks", "tools"))


def test_every_named_file_exists():
    missing = sorted(n for n in named_files(DOC.read_text()) if not exists(n))
    assert not missing, f"ARCHITECTURE.md names files that do not exist: {missing}"
    assert len(named_files(DOC.read_text())) > 60  # (the check sees the names)


def test_blocks_are_short_and_nothing_outside_is_cited():
    text = DOC.read_text()
    assert "../" not in text and "DESIGN" not in text
    block: list[str] = []
    in_code = False
    for line in text.splitlines() + [""]:
        if line.startswith("```"):
            in_code = not in_code
        starts_item = re.match(r"\s*(- |\d+\. |\| |#)", line) is not None
        if in_code or not line.strip() or starts_item:
            assert len(block) <= 15, "a block of more than 15 lines: " + " ".join(block)[:200]
            block = [line] if line.strip() and not in_code else []
        else:
            block.append(line)
    for line in text.splitlines():
        if line.startswith("|"):
            for cell in line.split("|"):
                assert len(cell) <= 15 * 100, f"a table cell of {len(cell)} characters"
