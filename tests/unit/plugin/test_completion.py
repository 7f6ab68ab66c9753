"""Shell completion of `kubectl vigil` (vigil.plugin.completion) without a cluster: what is
offered for the word being typed, in kubectl's plugin-completion protocol (one candidate a line,
then Cobra's `:directive`), names from a lookup handed in, bounded when the cluster is not there;
and the bash script, driven by bash itself through the installed console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vigil.plugin import cli, completion

pytestmark = pytest.mark.unit

NAMES = {
    "jobs": ["flaky", "poison", "poll"],
    "dead-letters": ["poison", "poll"],
    "queues": ["batch", "nightly"],
    "namespaces": ["default", "team-a"],
    "contexts": ["bed", "prod"],
}


class Lookup:
    def __init__(self) -> None:
        self.asked: list[tuple[str, completion.Scope]] = []

    def __call__(self, what: str, scope: completion.Scope) -> list[str]:
        self.asked.append((what, scope))
        return NAMES[what]


def offered(*words: str, lookup: Lookup | None = None) -> tuple[list[str], int]:
    found, directive = completion.candidates(cli.parser(), list(words), lookup or Lookup())
    return [line.split("\t")[0] for line in found], directive


def test_the_commands_with_their_help_and_no_file_names():
    found, directive = completion.candidates(cli.parser(), [""], Lookup())
    names = [line.split("\t")[0] for line in found]
    assert names == ["status", "dlq", "top", "redrive", "pause", "resume", "logs", "completion"]
    assert "logs\tthe log of an attempt's pod" in found  # the help's first clause, for zsh and fish
    assert directive == completion.DIRECTIVE_NO_FILES
    assert offered("re") == (["redrive", "resume"], completion.DIRECTIVE_NO_FILES)
    assert offered("-n", "team-a", "st") == (["status"], completion.DIRECTIVE_NO_FILES)


def test_names_from_the_cluster_in_the_namespace_typed():
    lookup = Lookup()
    assert offered("status", "po", lookup=lookup)[0] == ["poison", "poll"]
    assert offered("logs", "-n", "team-a", "", lookup=lookup)[0] == ["flaky", "poison", "poll"]
    assert lookup.asked[-1] == ("jobs", completion.Scope(namespace="team-a"))
    assert offered("--context", "prod", "--namespace=x", "pause", "", lookup=lookup)[0] == ["batch", "nightly"]
    assert lookup.asked[-1] == ("queues", completion.Scope(namespace="x", context="prod"))
    # a redrive takes dead-lettered jobs, each once; status takes one job and no more
    assert offered("redrive", "poison", "", lookup=lookup)[0] == ["poll"]
    assert offered("status", "poison", "") == ([], completion.DIRECTIVE_NO_FILES)
    assert offered("dlq", "") == ([], completion.DIRECTIVE_NO_FILES)


def test_flags_and_their_values():
    flags, _ = offered("logs", "--")
    assert {"--follow", "--all-attempts", "--attempt", "--tail", "--namespace", "--output"} <= set(flags)
    assert offered("dlq", "--no")[0] == ["--no-headers"]
    assert offered("logs", "-")[0][:3] == ["--all-attempts", "--attempt", "--container"]
    assert offered("top", "-o", "")[0] == list(completion.OUTPUT_VALUES)
    assert offered("top", "-o", "j") == (["json", "jsonpath="], completion.DIRECTIVE_NO_FILES)
    # what is left is the start of a template: no space after it
    assert offered("top", "-o", "jsonp") == (
        ["jsonpath="],
        completion.DIRECTIVE_NO_FILES | completion.DIRECTIVE_NO_SPACE,
    )
    assert offered("top", "--output=y")[0] == ["--output=yaml"]
    assert offered("-n", "t")[0] == ["team-a"]
    assert offered("status", "--context", "")[0] == ["bed", "prod"]
    assert offered("status", "--kubeconfig", "") == ([], completion.DIRECTIVE_DEFAULT)  # the shell's file names
    assert offered("logs", "x", "--attempt", "") == ([], completion.DIRECTIVE_NO_FILES)
    assert offered("completion", "")[0] == ["bash", "zsh", "fish"]


def test_tasks_completes_nothing_and_completion_goes_on_after_it():
    lookup = Lookup()
    assert offered("redrive", "poison", "--tasks", "", lookup=lookup) == ([], completion.DIRECTIVE_NO_FILES)
    assert offered("redrive", "poison", "--tasks=5", lookup=lookup) == ([], completion.DIRECTIVE_NO_FILES)
    assert lookup.asked == []  # ranges are typed, never looked up
    assert "--tasks" in offered("redrive", "--t")[0]
    # an array's tasks can be redriven while it runs: any job (not only the dead-lettered), one
    assert offered("redrive", "--tasks", "5", "", lookup=lookup)[0] == ["flaky", "poison", "poll"]
    assert lookup.asked[-1][0] == "jobs"
    assert offered("redrive", "--tasks", "5", "poison", "") == ([], completion.DIRECTIVE_NO_FILES)
    assert offered("redrive", "poison", "--tasks", "5", "-o", "n")[0] == ["name"]
    assert offered("redrive", "poison", "", lookup=lookup)[0] == ["poll"]  # without --tasks: as before
    assert completion.answer(["redrive", "poison", "--tasks", ""], Lookup()) == ":4\n"


def test_the_answer_is_kubectls_plugin_protocol():
    text = completion.answer(["pause", "n"], Lookup())
    assert text == "nightly\n:4\n"
    assert completion.answer(["nope-command", ""], Lookup()) == ":4\n"


def test_a_cluster_that_is_not_there_completes_nothing_within_the_bound(tmp_path: Path):
    kubeconfig = tmp_path / "kubeconfig"
    # 10.255.255.1: an address nothing answers (a connect that hangs until its timeout)
    kubeconfig.write_text(
        """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.255.255.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
    )
    started = time.monotonic()
    assert completion.cluster_lookup("jobs", completion.Scope(kubeconfig=str(kubeconfig))) == []
    assert time.monotonic() - started < completion.TIMEOUT_SECONDS + 1.5
    assert completion.cluster_lookup("jobs", completion.Scope(kubeconfig=str(tmp_path / "missing"))) == []
    assert completion.cluster_lookup("contexts", completion.Scope(kubeconfig=str(kubeconfig))) == ["x"]


def console_script(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    assert found.exists(), f"{name} is not installed: pip install -e . --no-deps"
    return str(found)


def test_the_scripts_are_printed_and_bash_completes_through_the_console_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    for shell, script in completion.SCRIPTS.items():
        assert cli.main(["completion", shell, "--kubeconfig", "/nonexistent"]) == cli.EXIT_OK  # asks nothing
        assert capsys.readouterr().out == script
    assert subprocess.run(["bash", "-n"], input=completion.BASH, text=True).returncode == 0
    for shell in ("zsh", "fish"):  # checked where the shell is there; bash is everywhere
        if shutil.which(shell):
            assert subprocess.run([shell, "-n"], input=completion.SCRIPTS[shell], text=True).returncode == 0
    driver = (
        completion.BASH
        + """
complete_line() { COMP_LINE=$1; COMP_POINT=${#COMP_LINE}; _kubectl_vigil; echo "${COMPREPLY[*]}"; }
complete_line 'kubectl-vigil re'
complete_line "kubectl-vigil dlq -o "
complete_line 'kubectl-vigil completion z'
complete_line 'kubectl-vigil top --output=js'
"""
    )
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "KUBECONFIG": str(tmp_path / "none")}
    done = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.splitlines() == [
        "redrive resume",
        " ".join(completion.OUTPUT_VALUES),
        "zsh",
        "json jsonpath=",  # after the '=' bash splits the word at
    ], done.stderr


def test_kubectl_complete_vigil_is_the_console_script_kubectl_looks_for():
    done = subprocess.run([console_script("kubectl_complete-vigil"), "lo"], capture_output=True, text=True)
    assert done.stdout.splitlines()[0].startswith("logs\t") and done.stdout.endswith(":4\n")
    # the same answer from the plugin itself, for the scripts (and a single-file plugin linked as it)
    done = subprocess.run([console_script("kubectl-vigil"), "__complete", "lo"], capture_output=True, text=True)
    assert done.stdout.splitlines()[0].startswith("logs\t")


def test_a_tab_loads_no_client_library_only_a_lookup_of_names_does():
    # Completion runs on every TAB: commands, flags and -o values come from the parser alone,
    # without the tenths of a second that aiohttp, the kubernetes client and pydantic take to load.
    probe = (
        "import sys; from vigil.plugin import completion; "
        "completion.answer(['logs', '--f'], lambda what, scope: []); "
        "heavy = ('aiohttp', 'kubernetes', 'pydantic', 'yaml', 'vigil.kube.client'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
