"""Every op of the Backend interface (src/backend/backend.hpp: the pure virtual ops from its conversions on)
is named by a row of the GPU-against-CPU check tables (tests/gpu/test_ops.cpp's op_checks(), and for the
FP8 descriptors' ops tests/gpu/test_fp8.cpp's fp8_op_checks()), so that a new op cannot land without its
check; and the tables name no op the interface lacks. Read from the sources, so it runs without a GPU."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def backend_ops(text):
    """The names of Backend's pure virtual ops from the '---- conversions' section to the end of the class."""
    body = text.split("class Backend {", 1)[1].split("\n};", 1)[0]
    ops = body.split("// ---- conversions", 1)[1]
    return set(re.findall(r"virtual\s+[\w:<>\s\*&]+?\b(\w+)\s*\([^;]*\)\s*(?:const\s*)?=\s*0\s*;", ops))


TABLES = [("tests/gpu/test_ops.cpp", "op_checks"), ("tests/gpu/test_fp8.cpp", "fp8_op_checks")]


def table_ops(text, function="op_checks"):
    """The op names the rows of a check table give (the string literals of each row's first braces)."""
    body = text.split(f"std::vector<OpCheck> {function}() {{", 1)[1].split("\n}\n", 1)[0]
    names = set()
    for group in re.findall(r"\{\{((?:\"\w+\"(?:,\s*)?)*)\}", body):
        names.update(re.findall(r"\"(\w+)\"", group))
    return names


def test_every_backend_op_has_a_gpu_check():
    ops = backend_ops((ROOT / "src/backend/backend.hpp").read_text())
    covered = set().union(*(table_ops((ROOT / path).read_text(), fn) for path, fn in TABLES))
    # the parse itself: the interface's known ops are found, so an empty set cannot pass
    assert {"matmul_fwd", "norm_bwd", "classifier", "sum_squares", "activation_fwd", "fp8_cast"} <= ops, ops
    assert not ops - covered, f"Backend ops with no row in a check table ({TABLES}): {sorted(ops - covered)}"
    assert not covered - ops, f"rows of the check tables name ops Backend does not have: {sorted(covered - ops)}"


def test_the_check_fails_for_an_op_without_a_row():
    header = (ROOT / "src/backend/backend.hpp").read_text()
    added = header.replace("  // ---- model ops\n", "  // ---- model ops\n  virtual void rope_fwd(const RopeFwd& op) = 0;\n", 1)
    assert added != header, "backend.hpp has no '// ---- model ops' line to add an op after"
    covered = table_ops((ROOT / "tests/gpu/test_ops.cpp").read_text())
    assert "rope_fwd" in backend_ops(added) - covered
