"""The rooms of docs/DESIGN.md against the code: every #include of every source under src/ and kernels/
(.cpp, .hpp, .cu, .cuh, .h, .inc) may point only at its own room or one listed above it."""
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SUFFIXES = {".cpp", ".hpp", ".cu", ".cuh", ".h", ".inc"}


def rooms(root):
    """The rooms in DESIGN.md's order: ['src/base', 'kernels', ...]."""
    text = (root / "docs" / "DESIGN.md").read_text()
    section = text.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"^\| `([a-z_/]+)/` \|", section, re.M)
    assert found, "docs/DESIGN.md's Rooms table lists no folders"
    return found


def room_of(rel, order):
    """The room of a repository path (the longest room prefix), or None."""
    hits = [r for r in order if str(rel) == r or str(rel).startswith(r + "/")]
    return max(hits, key=len) if hits else None


def resolve(root, src, inc):
    """The repository path an include names: relative to the including file, else to src/ or the root
    (the build's -I. -Isrc)."""
    for base in (src.parent, root / "src", root):
        cand = (base / inc).resolve()
        if cand.is_file():
            return cand.relative_to(root.resolve())
    return None


def check(root):
    """(includes read, problems) for the tree at root."""
    order = rooms(root)
    rank = {r: i for i, r in enumerate(order)}
    problems, seen = [], 0
    for top in ("src", "kernels"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in SUFFIXES:
                continue
            rel = f.relative_to(root)
            mine = room_of(rel, order)
            if mine is None:
                problems.append(f"{rel} is in no room of docs/DESIGN.md")
                continue
            for inc in INCLUDE.findall(f.read_text(errors="replace")):
                target = resolve(root, f, inc)
                seen += 1
                theirs = room_of(target, order) if target else None
                if target is None:
                    problems.append(f'{rel}: #include "{inc}" names no file in the tree')
                elif theirs is None:
                    problems.append(f"{rel} includes {target}, which is in no room")
                elif rank[theirs] > rank[mine]:
                    problems.append(f"{rel} ({mine}) includes {target} ({theirs}), a room below it in the list")
    return seen, problems


def test_every_include_points_up_the_rooms():
    seen, problems = check(ROOT)
    assert seen > 300, f"only {seen} includes read: the scan is not reading the sources"
    assert not problems, "includes against docs/DESIGN.md's order of rooms:\n" + "\n".join(problems)


def test_a_back_edge_is_found(tmp_path):
    """The check on a copy of the tree with one include against the order (the model doing collectives)."""
    for part in ("docs", "src", "kernels"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("*.png"))
    assert check(tmp_path)[1] == []
    (tmp_path / "src" / "model" / "collective.hpp").write_text('#include "parallel/comm.hpp"\n')
    (tmp_path / "src" / "base" / "bad.hpp").write_text('#include "kernels/common.cuh"\n#include "missing.hpp"\n')
    problems = check(tmp_path)[1]
    assert any("src/model/collective.hpp (src/model) includes src/parallel/comm.hpp" in p for p in problems), problems
    assert any("src/base/bad.hpp (src/base) includes kernels/common.cuh" in p for p in problems), problems
    assert any('"missing.hpp" names no file' in p for p in problems), problems
    assert len(problems) == 3, problems
