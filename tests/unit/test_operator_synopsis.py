"""The README's synopsis of `vigil operator` names every flag the command has (it had missed
eight), and none it does not have: the flags are read from the command's own help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vigil import cli

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def parser_flags(capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The long flags of `vigil operator --help`'s option lines (`  -n NAMESPACE, --namespace NAMESPACE`)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["operator", "--help"])
    assert exited.value.code == 0
    invocations = re.findall(r"^  (-\S.*?)(?:\s{2,}|$)", capsys.readouterr().out, re.M)
    return {flag for line in invocations for flag in FLAG.findall(line)} - {"--help"}


def synopsis() -> str:
    section = README.read_text().split("\n### Running the operator\n", 1)[1]
    block = re.search(r"```sh\n(vigil operator .*?)```", section, re.S)
    assert block, "README.md's 'Running the operator' has no `vigil operator` synopsis any more"
    return block.group(1)


def test_the_readme_synopsis_names_every_flag_of_vigil_operator(capsys: pytest.CaptureFixture[str]):
    flags = parser_flags(capsys)
    assert {"--namespace", "--beat-address", "--leader-elect", "--no-leader-elect"} <= flags  # the reading works
    named = set(FLAG.findall(synopsis()))
    assert not flags - named, f"README.md's synopsis of `vigil operator` misses {sorted(flags - named)}"
    assert not named - flags, (
        f"README.md's synopsis names flags `vigil operator` does not have: {sorted(named - flags)}"
    )
