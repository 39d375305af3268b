"""`peloton completion bash|zsh`: a completion script made from the parser itself, so that it always knows every
command, flag and choice there is. Job ids are completed by asking the daemon (`peloton job list -q`), with the
--address/--context given on the command line being completed."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from peloton.cli.parser import CONNECTION_DESTS

FILE_METAVARS = frozenset({"FILE", "DIR"})
JOB_ID_DESTS = frozenset({"job_id", "job_ids"})


def _commands(p: argparse.ArgumentParser, path: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _case(name: str, entries: dict[str, str]) -> str:
    """A shell function (the same text works in bash and zsh) printing the words for its argument."""
    arms = "".join(f'        "{key}") echo "{words}" ;;\n' for key, words in entries.items() if words)
    return f"{name}() {{\n    case \"$1\" in\n{arms}    esac\n}}\n"


def _tables(parser: argparse.ArgumentParser) -> str:
    subs: dict[str, str] = {}
    opts: dict[str, str] = {}
    valued: dict[str, str] = {}
    choices: dict[str, str] = {}
    positional: dict[str, str] = {}
    for path, p in _commands(parser):
        key = " ".join(path)
        flags: list[str] = []
        takes: list[str] = []
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                subs[key] = " ".join(a.choices)
            elif not a.option_strings:
                if a.dest in JOB_ID_DESTS:
                    positional.setdefault(key, "@jobid")
                elif a.choices:
                    positional.setdefault(key, " ".join(map(str, a.choices)))
            elif a.help != argparse.SUPPRESS or a.dest in CONNECTION_DESTS:  # those are described once only
                flags += a.option_strings
                if a.nargs != 0:
                    takes += a.option_strings
                    words = (" ".join(map(str, a.choices)) if a.choices else
                             "@file" if a.metavar in FILE_METAVARS else "")
                    for o in a.option_strings:
                        choices[f"{key} {o}".strip()] = words
        opts[key], valued[key] = " ".join(flags), " ".join(takes)
    return "".join([_case("_peloton_subs", subs), _case("_peloton_opts", opts), _case("_peloton_valued", valued),
                    _case("_peloton_choices", choices), _case("_peloton_positional", positional)])


# The command path is found by walking the words typed so far: a word that is a subcommand of the path so far
# extends it; a flag that takes a value skips the next word; --address/--context are kept for listing job ids.
_BASH = """
_peloton() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local cmdpath="" w i skip=0
    local -a conn=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        if ((skip)); then
            skip=0
            continue
        fi
        if [[ "$w" == -* ]]; then
            if [[ " $(_peloton_valued "$cmdpath") " == *" ${w%%=*} "* && "$w" != *=* ]]; then
                skip=1
                if [[ "$w" == --address || "$w" == --context ]]; then conn+=("$w" "${COMP_WORDS[i+1]}"); fi
            fi
        elif [[ " $(_peloton_subs "$cmdpath") " == *" $w "* ]]; then
            cmdpath="${cmdpath:+$cmdpath }$w"
        fi
    done
    COMPREPLY=()
    if [[ "$prev" == -* && " $(_peloton_valued "$cmdpath") " == *" $prev "* ]]; then
        local values
        values="$(_peloton_choices "${cmdpath:+$cmdpath }$prev")"
        if [[ "$values" == @file ]]; then
            COMPREPLY=($(compgen -f -- "$cur"))
        elif [[ -n "$values" ]]; then
            COMPREPLY=($(compgen -W "$values" -- "$cur"))
        fi
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_peloton_opts "$cmdpath")" -- "$cur"))
    elif [[ -n "$(_peloton_subs "$cmdpath")" ]]; then
        COMPREPLY=($(compgen -W "$(_peloton_subs "$cmdpath")" -- "$cur"))
    else
        local pos
        pos="$(_peloton_positional "$cmdpath")"
        if [[ "$pos" == @jobid ]]; then
            COMPREPLY=($(compgen -W "$(peloton "${conn[@]}" job list -q --limit 200 2>/dev/null)" -- "$cur"))
        elif [[ -n "$pos" ]]; then
            COMPREPLY=($(compgen -W "$pos" -- "$cur"))
        fi
    fi
    return 0
}
complete -o default -F _peloton peloton
"""

_ZSH = """
_peloton() {
    local cur="${words[CURRENT]}" prev="${words[CURRENT-1]}"
    local cmdpath="" w i skip=0
    local -a conn
    conn=()
    for ((i = 2; i < CURRENT; i++)); do
        w="${words[i]}"
        if ((skip)); then
            skip=0
            continue
        fi
        if [[ "$w" == -* ]]; then
            if [[ " $(_peloton_valued "$cmdpath") " == *" ${w%%=*} "* && "$w" != *=* ]]; then
                skip=1
                if [[ "$w" == --address || "$w" == --context ]]; then conn+=("$w" "${words[i+1]}"); fi
            fi
        elif [[ " $(_peloton_subs "$cmdpath") " == *" $w "* ]]; then
            cmdpath="${cmdpath:+$cmdpath }$w"
        fi
    done
    if [[ "$prev" == -* && " $(_peloton_valued "$cmdpath") " == *" $prev "* ]]; then
        local values
        values="$(_peloton_choices "${cmdpath:+$cmdpath }$prev")"
        if [[ "$values" == @file ]]; then
            _files
        elif [[ -n "$values" ]]; then
            compadd -- ${=values}
        fi
        return 0
    fi
    if [[ "$cur" == -* ]]; then
        compadd -- ${=$(_peloton_opts "$cmdpath")}
    elif [[ -n "$(_peloton_subs "$cmdpath")" ]]; then
        compadd -- ${=$(_peloton_subs "$cmdpath")}
    else
        local pos
        pos="$(_peloton_positional "$cmdpath")"
        if [[ "$pos" == @jobid ]]; then
            compadd -- ${=$(peloton "${conn[@]}" job list -q --limit 200 2>/dev/null)}
        elif [[ -n "$pos" ]]; then
            compadd -- ${=pos}
        else
            _files
        fi
    fi
    return 0
}
if [[ "${funcstack[1]}" == _peloton ]]; then
    _peloton "$@"
else
    compdef _peloton peloton
fi
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for `shell` (bash or zsh)."""
    if shell == "bash":
        head = "# bash completion for peloton: source <(peloton completion bash)\n"
        return head + _tables(parser) + _BASH
    head = ("#compdef peloton\n# zsh completion for peloton: source <(peloton completion zsh) after compinit, or save "
            "it as _peloton in a directory of $fpath\n")
    return head + _tables(parser) + _ZSH
