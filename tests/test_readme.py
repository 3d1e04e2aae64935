"""The README's commands: the CI test block shows skip reasons; the Quick start says how long the demo takes."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_ci_test_block_shows_why_tests_are_skipped():
    # .ci/run runs the first fenced block under '## Tests'; pytest's -q alone hid why ~30 tests were skipped
    block = re.search(r"```bash\n(.*?)```", _section("Tests"), re.S).group(1)
    pytest_lines = [line for line in block.splitlines() if "pytest" in line]
    assert pytest_lines and all(re.search(r"\s-r\w*s", line) for line in pytest_lines), pytest_lines


def test_the_quick_start_says_how_long_the_demo_takes():
    quick = _section("Quick start")
    assert "flowgp demo" in quick
    assert re.search(r"takes about \d+ (seconds|minutes?)", quick) and "progress" in quick


def test_gitignore_covers_every_virtual_environment_the_readme_creates():
    # the README's two set-ups create .venv and .venv-test; .gitignore once missed the second
    venvs = re.findall(r"-m venv (\S+)", README.read_text())
    ignored = {line.strip().strip("/") for line in (README.parent / ".gitignore").read_text().splitlines()}
    assert venvs and all(v.strip("/") in ignored for v in venvs), (venvs, sorted(ignored))


def test_the_python_blocks_run_in_order_in_one_interpreter(tmp_path, monkeypatch):
    # a reader pastes the README's Python blocks one after another: they must work as written, in that order
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)  # the blocks save files: keep them out of the repository
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)


def test_the_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 150
