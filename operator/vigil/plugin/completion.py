"""Shell completion for `kubectl vigil`: what to offer for the word being typed, and the scripts.

kubectl (1.26 and later) completes a plugin's arguments by running `kubectl_complete-<plugin>`
from PATH with the words typed after the plugin's name, the last one the word being completed
("" for a new one), and reading one candidate a line (`NAME<TAB>description`), then Cobra's
directive as a last line `:N` (4: no file names; 0: the shell's default, file names). The
console script `kubectl_complete-vigil` is that executable; `kubectl-vigil __complete WORDS...`
answers the same, for the scripts `kubectl vigil completion bash|zsh|fish` prints (for
`kubectl-vigil` typed on its own).

`candidates` decides, pure, from the command's own parser (so a new flag or command completes
without a change here) and a lookup of names handed in; the names come from the cluster in one
bounded request (`LIMIT` names, `TIMEOUT_SECONDS`), and a cluster that does not answer completes
nothing rather than hang the shell.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vigil.plugin.args import SHELLS, parser

DIRECTIVE_DEFAULT = 0  # the shell completes file names
DIRECTIVE_NO_SPACE = 2
DIRECTIVE_NO_FILES = 4
LIMIT = 200  # names listed for a completion: one request, one page
TIMEOUT_SECONDS = 2.0  # a TAB must not hang on a cluster that does not answer
OUTPUT_VALUES = ("table", "wide", "name", "json", "yaml", "jsonpath=", "custom-columns=")

# What each command's positional arguments name: a kind of object to list from the cluster, or
# fixed words. The value: (what, how many: 1, or None for any number).
POSITIONALS: dict[str, tuple[str, int | None]] = {
    "status": ("jobs", 1),
    "logs": ("jobs", 1),
    "redrive": ("dead-letters", None),
    "pause": ("queues", 1),
    "resume": ("queues", 1),
    "completion": ("shells", 1),
}
# The flags whose value names something to list or offer.
FLAG_VALUES = {"--namespace": "namespaces", "--context": "contexts", "--output": "outputs", "--kubeconfig": "files"}

Lookup = Callable[[str, "Scope"], Sequence[str]]  # (what, where) -> names


@dataclass(frozen=True)
class Scope:
    """Where names are listed: the flags typed so far."""

    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {}


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def _canonical(action: argparse.Action) -> str:
    """The long name of a flag (`--namespace` for `-n`)."""
    return max(action.option_strings, key=len)


def candidates(parser: argparse.ArgumentParser, words: Sequence[str], lookup: Lookup) -> tuple[list[str], int]:
    """What to offer for the last of `words` (the words after `kubectl vigil`, the last one being
    typed), and Cobra's directive."""
    *done, typed = list(words) or [""]
    commands = _commands(parser)
    command: str | None = None
    flags = _flags(parser)
    values: dict[str, str] = {}
    positionals: list[str] = []
    pending: argparse.Action | None = None  # a flag whose value is the next word
    for word in done:
        if pending is not None:
            values[_canonical(pending)] = word
            pending = None
        elif word.startswith("-") and word != "-":
            name, eq, value = word.partition("=")
            action = flags.get(name)
            if action is None and not name.startswith("--") and len(name) > 2:
                action, value, eq = flags.get(name[:2]), name[2:], "="  # -nteam-a
            if action is not None and action.nargs != 0:
                if eq:
                    values[_canonical(action)] = value
                else:
                    pending = action
        elif command is None and word in commands:
            command = word
            flags = _flags(commands[word])
        else:
            positionals.append(word)
    scope = Scope(values.get("--namespace"), values.get("--kubeconfig"), values.get("--context"))

    if pending is not None:
        return _values(_canonical(pending), typed, "", scope, lookup)
    if typed.startswith("-"):
        name, eq, value = typed.partition("=")
        action = flags.get(name)
        if eq and action is not None and action.nargs != 0:
            return _values(_canonical(action), value, f"{name}=", scope, lookup)
        offered = sorted({option for option in flags if option.startswith(typed) and option.startswith("--")})
        if typed in ("-", "") or not offered:
            offered = sorted(option for option in flags if option.startswith(typed))
        return [_described(option, flags[option].help) for option in offered], DIRECTIVE_NO_FILES
    if command is None:
        if positionals:  # a word that is no command: nothing follows it
            return [], DIRECTIVE_NO_FILES
        helps = _helps(parser)
        names = [name for name in commands if name.startswith(typed) and not name.startswith("_")]
        return [_described(name, helps.get(name)) for name in names], DIRECTIVE_NO_FILES
    what, count = POSITIONALS.get(command, ("", 0))
    if command == "redrive" and "--tasks" in values:  # some tasks of one array, dead-lettered or still running
        what, count = "jobs", 1
    if not what or (count is not None and len(positionals) >= count):
        return [], DIRECTIVE_NO_FILES
    return _named(what, typed, "", scope, lookup, exclude=positionals)


def _described(word: str, help: str | None) -> str:
    """`WORD<TAB>description`, the description the help's first clause (zsh and fish show it)."""
    short = re.split(r";| \(|\. ", help or "", maxsplit=1)[0].strip().rstrip(":,")
    return f"{word}\t{short}" if short else word


def _values(flag: str, typed: str, prefix: str, scope: Scope, lookup: Lookup) -> tuple[list[str], int]:
    what = FLAG_VALUES.get(flag)
    if what == "files":
        return [], DIRECTIVE_DEFAULT
    if what is None:
        return [], DIRECTIVE_NO_FILES  # a number, a selector, a container: nothing to offer
    return _named(what, typed, prefix, scope, lookup)


def _named(
    what: str, typed: str, prefix: str, scope: Scope, lookup: Lookup, exclude: Sequence[str] = ()
) -> tuple[list[str], int]:
    if what == "outputs":
        names: Sequence[str] = OUTPUT_VALUES
    elif what == "shells":
        names = SHELLS
    else:
        names = lookup(what, scope)
    found = [prefix + name for name in names if name.startswith(typed) and name not in exclude]
    # `-o jsonpath=` goes on with its template: no space after it (when it is all that is left)
    directive = DIRECTIVE_NO_FILES | (DIRECTIVE_NO_SPACE if found and all(n.endswith("=") for n in found) else 0)
    return found, directive


def answer(words: Sequence[str], lookup: Lookup) -> str:
    """What the completion executable prints: the candidates, then `:directive`."""
    found, directive = candidates(parser(), words, lookup)
    return "".join(line + "\n" for line in found) + f":{directive}\n"


# --- the names, from the cluster ----------------------------------------------------------------


def cluster_lookup(what: str, scope: Scope) -> list[str]:
    """The names of `what` in the scope's namespace: one request of at most LIMIT names, within
    TIMEOUT_SECONDS; nothing when it cannot be asked (a TAB prints no error)."""
    try:
        return asyncio.run(asyncio.wait_for(_list_names(what, scope), TIMEOUT_SECONDS))
    except Exception:  # no kubeconfig, no cluster, no permission, too slow: nothing to offer
        return []


async def _list_names(what: str, scope: Scope) -> list[str]:
    if what == "contexts":
        from kubernetes import config as kubeconfig

        contexts, _ = kubeconfig.list_kube_config_contexts(config_file=scope.kubeconfig)
        return sorted(context["name"] for context in contexts)
    from vigil.api.names import GROUP, LABEL_DEAD_LETTER, PLURAL, QUEUE_PLURAL, VERSION
    from vigil.kube import config
    from vigil.kube.client import ApiClient, resource_path, user_agent

    namespace = scope.namespace or config.context_namespace(scope.kubeconfig, scope.context) or "default"
    params = {"limit": str(LIMIT)}
    if what == "namespaces":
        path = resource_path("", "v1", "namespaces", None)
    elif what == "queues":
        path = resource_path(GROUP, VERSION, QUEUE_PLURAL, namespace)
    else:
        path = resource_path(GROUP, VERSION, PLURAL, namespace)
        if what == "dead-letters":
            params["labelSelector"] = f"{LABEL_DEAD_LETTER}=true"
    http = ApiClient(
        config.load(scope.kubeconfig, scope.context),
        user_agent(None, "kubectl-vigil"),
        connect_timeout=TIMEOUT_SECONDS,
        read_timeout=TIMEOUT_SECONDS,
    )
    try:
        body = await http.request("GET", path, params=params, timeout=TIMEOUT_SECONDS) or {}
    finally:
        await http.close()
    return sorted((item.get("metadata") or {}).get("name", "") for item in body.get("items") or [])


def main(argv: list[str] | None = None) -> int:
    """`kubectl_complete-vigil WORDS...`: what kubectl runs for `kubectl vigil ...<TAB>`."""
    sys.stdout.write(answer(sys.argv[1:] if argv is None else argv, cluster_lookup))
    return 0


# --- the scripts: `kubectl vigil completion SHELL` ----------------------------------------------

BASH = r"""# bash completion for kubectl-vigil; load it with: source <(kubectl vigil completion bash)
# (`kubectl vigil <TAB>` needs none of this: kubectl >= 1.26 runs kubectl_complete-vigil itself)
_kubectl_vigil() {
    local line=${COMP_LINE:0:COMP_POINT} out directive typed
    local -a words
    IFS=$' \t' read -ra words <<< "$line"
    [[ $line =~ [[:space:]]$ ]] && words+=("")
    typed=${words[${#words[@]}-1]}
    out=$(kubectl-vigil __complete "${words[@]:1}" 2>/dev/null) || return
    directive=${out##*:}
    out=$(printf '%s\n' "$out" | sed '$d' | cut -f1)
    # bash splits a word at '=' (COMP_WORDBREAKS): what is offered is what follows it
    if [[ $typed == *=* ]]; then
        out=$(printf '%s\n' "$out" | sed 's/^[^=]*=//')
        typed=${typed#*=}
    fi
    local IFS=$'\n'
    COMPREPLY=($(compgen -W "$out" -- "$typed"))
    if [[ $directive == 0 && ${#COMPREPLY[@]} -eq 0 ]]; then
        COMPREPLY=($(compgen -f -- "$typed"))
    fi
    if (( directive & 2 )); then
        compopt -o nospace 2>/dev/null
    fi
}
complete -F _kubectl_vigil kubectl-vigil
"""

ZSH = r"""#compdef kubectl-vigil
# zsh completion for kubectl-vigil; load it with: source <(kubectl vigil completion zsh)
# (`kubectl vigil <TAB>` needs none of this: kubectl >= 1.26 runs kubectl_complete-vigil itself)
_kubectl_vigil() {
    local -a lines completions
    local line directive
    lines=("${(@f)$(kubectl-vigil __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    directive=${lines[-1]#:}
    for line in "${(@)lines[1,-2]}"; do
        [[ -z $line ]] && continue
        if [[ $line == *$'\t'* ]]; then
            completions+=("${${line%%$'\t'*}//:/\\:}:${line#*$'\t'}")
        else
            completions+=("${line//:/\\:}")
        fi
    done
    if (( ${#completions} )); then
        if (( directive & 2 )); then
            _describe 'kubectl vigil' completions -S ''
        else
            _describe 'kubectl vigil' completions
        fi
    elif [[ $directive == 0 ]]; then
        _files
    fi
}
compdef _kubectl_vigil kubectl-vigil
"""

FISH = r"""# fish completion for kubectl-vigil; load it with: kubectl vigil completion fish | source
# (`kubectl vigil <TAB>` needs none of this: kubectl >= 1.26 runs kubectl_complete-vigil itself)
function __kubectl_vigil_complete
    set -l words (commandline -opc)
    set -l current (commandline -ct)
    kubectl-vigil __complete $words[2..-1] "$current" 2>/dev/null | string match -v -r '^:[0-9]+$'
end
complete -c kubectl-vigil -f -a '(__kubectl_vigil_complete)'
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH, "fish": FISH}
