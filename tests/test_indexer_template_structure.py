"""Structure rule of the indexer templates (DESIGN.md "How the kernel code is organised"): jinja
substitutes constants and chooses blocks; no jinja control statement ({% if %}, {% for %}, ...)
sits inside a function body, and the building blocks the generated modules import
(codegen/cute_blocks/indexer/) are plain Python."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTROL = re.compile(r"\{%-?\s*(if|elif|else|endif|for|endfor|include|macro|set)\b")
DEF = re.compile(r"^(\s*)(?:async\s+)?def\s")
# Every indexer template follows the rule; NOT_YET names one that does not yet (none now).
CONVERTED = ["indexer_logits.py.j2", "indexer_topk_fused.py.j2", "topk.py.j2"]
NOT_YET: list[str] = []

def control_lines_in_function_bodies(text: str) -> list[int]:
    """Line numbers (1-based) of jinja control statements inside a `def` body. A body runs from
    its `def` to the next code line indented no deeper than the `def` (jinja-only, blank and
    comment lines do not end it)."""
    bad, def_indent = [], None
    for n, line in enumerate(text.splitlines(), 1):
        code = CONTROL.sub("", line) if line.lstrip().startswith("{%") else line
        stripped = code.strip()
        if def_indent is not None and stripped and not stripped.startswith(("#", "{%")):
            indent = len(code) - len(code.lstrip())
            if indent <= def_indent and not DEF.match(code):
                def_indent = None
        m = DEF.match(code)
        if m:
            def_indent = len(m.group(1))
            continue
        if def_indent is not None and CONTROL.search(line):
            bad.append(n)
    return bad


def test_rule_detects_a_branch_inside_a_body():
    text = "def f():\n    x = 1\n{% if a %}\n    y = 2\n{% endif %}\n    return x\n\n\nX = 1\n{% if b %}\nY = 2\n{% endif %}\n"
    assert control_lines_in_function_bodies(text) == [3, 5]
    assert control_lines_in_function_bodies("def f(a, {% if s %}b, {% endif %}c):\n    pass\n") == []


@pytest.mark.parametrize("name", CONVERTED)
def test_no_jinja_control_inside_function_bodies(name):
    text = (ROOT / "templates" / name).read_text()
    assert control_lines_in_function_bodies(text) == [], name
    # nor inside a def's signature: entry points differ by class (e.g. TopKStageWithScores)
    assert not [ln for ln in text.splitlines() if DEF.match(ln) and "{%" in ln], name


def test_every_indexer_template_is_listed():
    """Every indexer template is either converted or listed as not yet; a listed one still has
    what it is listed for (drop it from NOT_YET once converted)."""
    names = {p.name for p in (ROOT / "templates").glob("*.j2")
             if p.name.startswith(("indexer", "topk"))}
    assert names == set(CONVERTED) | set(NOT_YET)
    for name in NOT_YET:
        assert control_lines_in_function_bodies((ROOT / "templates" / name).read_text()), name


@pytest.mark.parametrize("name", CONVERTED)
def test_templates_choose_blocks(name):
    """A converted template holds no kernel: its classes only pick building blocks and pass the
    spec on (no @cute.kernel, and the kernels it names come from codegen/cute_blocks/indexer)."""
    text = (ROOT / "templates" / name).read_text()
    assert "@cute.kernel" not in text and "@cute.jit" not in text, name
    assert "from codegen.cute_blocks.indexer." in text, name


def test_indexer_blocks_are_plain_python():
    blocks = sorted((ROOT / "codegen" / "cute_blocks" / "indexer").glob("*.py"))
    assert blocks
    for p in blocks:
        text = p.read_text()
        assert "{%" not in text and "{{" not in text, p.name
        compile(text, str(p), "exec")
    assert not (ROOT / "templates" / "indexer").exists() or not list((ROOT / "templates" / "indexer").glob("*.j2"))
