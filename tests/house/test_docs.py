"""The documentation as a user meets it: the first-inference page's commands run as written, and
what the README and the settings page promise.

The site itself is checked by `make lint` (`mkdocs build --strict`: broken links, pages missing
from the nav, and the CLI and HTTP references generated from the code).

How a page marks the commands this test runs: an HTML comment `<!-- test: run -->` on the line
right before a fenced ```console block. In such a block a line starting with `$ ` is a command,
run by bash as written (so `~` and `$HOME` expand) with the project's `mxq` and `python` first on
PATH; the lines after it, up to the next command, are output the command must show (stdout and
stderr together). Output lines are compared with runs of whitespace collapsed (Rich pads its
table cells to the terminal's width); a line that is only `…` stands for output left out and is
not checked; a line ending in `…` must appear up to the `…`. The page's API port, 8470, is the
test's free port. Every command must exit 0. The blocks run in order, on one stack of their own:
the embedded default in a temporary folder that is both `MXQ_HOME`'s parent and `$HOME` (so the
data root), with two CPU devices and no GPU; `mxq down` runs at the end whatever happened.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

DOCS = ROOT / "docs"
MARK = "<!-- test: run -->"
ELIDED = "…"
PAGE_PORT = "8470"
README_MAX_LINES = 250


def marked_commands(page: Path) -> list[tuple[str, list[str]]]:
    """Each command of the page's marked blocks, in order, with the output lines shown under it."""
    commands: list[tuple[str, list[str]]] = []
    for block in re.findall(rf"^{re.escape(MARK)}\n```console\n(.*?)^```", page.read_text(), re.S | re.M):
        for line in block.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif line.strip():
                assert commands, f"{page.name}: output before any command in a marked block: {line!r}"
                commands[-1][1].append(line)
    return commands


def _squeeze(text: str) -> str:
    return " ".join(text.split())


def shows(output: str, expected: str) -> bool:
    """Whether `output` shows the page's line `expected` (see the module's docstring)."""
    lines = [_squeeze(line) for line in output.splitlines()]
    if expected.strip() == ELIDED:
        return True
    wanted = _squeeze(expected.removesuffix(ELIDED) if expected.rstrip().endswith(ELIDED) else expected)
    return any(wanted in line for line in lines)


@pytest.mark.slow  # long real-process work: make test-all (CI) runs it
def test_the_first_inference_page_runs_as_written(tmp_path: Path) -> None:
    commands = marked_commands(DOCS / "first-inference.md")
    assert sum(c.split()[0] == "mxq" for c, _ in commands) >= 5, commands  # the page still has its tour
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "mxq").exists(), f"no mxq beside {sys.executable}: run the tests from the venv"
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MXQ_", "CUDA_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", HOME=str(tmp_path),
               MXQ_HOME=str(tmp_path / "var"), MXQ_NODE="docsnode", MXQ_CPU_DEVICES="2",
               MXQ_NVIDIA_SMI="none", MXQ_API_PORT=port, COLUMNS="200")

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=300)

    try:
        for command, expected in commands:
            proc = run(command)
            output = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{output}"
            for line in expected:
                line = line.replace(f":{PAGE_PORT}/", f":{port}/")
                assert shows(output, line), f"`{command}` did not show {line!r}:\n{output}"
    finally:
        down = run("mxq down")
        assert down.returncode == 0, down.stdout + down.stderr


def test_the_marker_rules_read_a_block_as_the_docstring_says() -> None:
    output = "│ status           │ succeeded                     │\nstopped: workers (launcher pid 7)"
    assert shows(output, "│ status │ succeeded │") and shows(output, "stopped: workers …")
    assert shows(output, "…") and not shows(output, "│ status │ failed │")


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local), "the README links into docs/"
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_every_setting_is_on_the_settings_page() -> None:
    """The settings table moved from the README to docs/settings.md: every `MXQ_*` setting a user
    sets is there (the three the launcher sets for each worker it starts are not for users)."""
    from mxq.workers.settings import Settings

    page = (DOCS / "settings.md").read_text()
    set_by_the_launcher = {"device", "device_model", "mxnet_unusable"}
    names = [field.validation_alias if isinstance(field.validation_alias, str) else f"MXQ_{name.upper()}"
             for name, field in Settings.model_fields.items() if name not in set_by_the_launcher]
    assert [n for n in names if f"`{n}`" not in page] == []


def test_a_schema_number_the_docs_name_is_the_newest_migration() -> None:
    """A page that quotes `mxq migrate`'s answer names the schema this release migrates to."""
    newest = max(p.name[:4] for p in (ROOT / "db" / "migrations" / "versions").glob("[0-9]*.py"))
    quoted = {(page.name, n) for page in (ROOT / "docs").glob("*.md")
              for n in re.findall(r"newest schema \((\d{4})\)", page.read_text())}
    assert quoted, "no page quotes the newest schema any more: drop this test"
    assert {n for _, n in quoted} == {newest}, quoted
