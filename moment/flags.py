"""Library errors in the command line's words: a parameter the library names becomes its flag.

The library states a problem in its own terms: a message names a parameter in
backticks, as `` `name` `` or `` `name=value` `` ("`feature_dtype` int8: the
features are int64, not floats ..."), and knows nothing of options. The command
line knows which of its options sets which parameter: :func:`in_flags` rewrites
each such name that an option of the command that ran sets into that
option ("--feature-dtype int8: ..."), `` `name=True` `` into the bare switch,
and leaves every other backticked text as it is. An option's ``dest`` is the
parameter it sets unless :data:`ALIASES` says otherwise for that command.

>>> import argparse
>>> p = argparse.ArgumentParser(prog="moment")
>>> data = p.add_subparsers(dest="command").add_parser("data")
>>> synth = data.add_subparsers(dest="data_command").add_parser("synth")
>>> _ = synth.add_argument("--nodes"), synth.add_argument("--force", action="store_true")
>>> args = p.parse_args(["data", "synth", "--nodes", "1"])
>>> in_flags("`num_nodes` 1: expected 2 or more; `overwrite=True` replaces it; `g` stays", p, args)
'--nodes 1: expected 2 or more; --force replaces it; `g` stays'
"""

from __future__ import annotations

import argparse
import re

#: per command (its words, as typed), library parameters whose option is not ``--`` + the dashed
#: name; the entry ``""`` holds for every command
ALIASES: dict[str, dict[str, str]] = {
    "": {"unknown_link_bytes_per_s": "--unknown-link-gbps", "accelerator_cache_share": "--gpu-cache-share",
         "host_memory_share": "--cpu-cache-share"},
    "data synth": {"num_nodes": "--nodes", "num_edges": "--edges", "num_classes": "--classes",
                   "overwrite": "--force"},
    "data partition": {"overwrite": "--force"},
    "data import": {"overwrite": "--force", "keys": "--hdf5-key", "classes": "--igb-classes"},
    "plan": {"nic_bytes_per_s": "--nic-gbps", "place_nics": "--nics K"},
    "place": {"ssd_dirs": "--ssd", "gpu_mode": "--gpu-cache-mode", "gpu_cache_bytes": "--gpu-cache",
              "cpu_cache_bytes": "--cpu-cache", "cpu_cache_sizing": "--cpu-cache auto", "num_nodes": "--nodes",
              "method": "--hotness", "groups": "--replica-groups", "halo_cache_bytes": "--halo-cache",
              "node_handoffs": "--plans", "num_batches": "--presample-batches"},
    "train": {"checkpoint_dir": "--checkpoint", "metrics_path": "--metrics", "arch": "--model",
              "timeout_s": "--timeout", "remote_cache_bytes": "--remote-cache",
              "dynamic_cache_bytes": "--dynamic-cache",
              "dynamic_cache_on": "--dynamic-cache-on", "eval_every_epochs": "--eval-every",
              "checkpoint_every_steps": "--checkpoint-every",
              "gpu_mode": "`moment place --gpu-cache-mode`", "gpu_cache_bytes": "`moment place --gpu-cache`",
              "feature_dtype": "`moment place --feature-dtype`", "force": "`moment place --force`"},
    "report": {"metrics_path": "`moment train --metrics`"},
    "infer": {"overwrite": "--force", "chunk_bytes": "--chunk-size"},
    "bench emulate": {"metrics_path": "`moment train --metrics`"},
    "profile": {"file_bytes": "--file-size"},
    "bench io raw": {"file_bytes": "--file-size"},
}

#: library calls a message may send the user to, and the command that makes the same call
CALLS: dict[str, str] = {
    "place_sharded": "`moment place --nodes N`",
    "planner.handoff.plan_document": "`moment plan --json > FILE`",
    "training.stream.record_stream": "`moment bench record`",
    "training.data.open_dataset(verify='full')": "`moment data info --verify DATASET`",
    "training.link.store.write_link_dataset": "`moment data split-edges SRC DST`",
}

#: a parameter named by the library: `name` or `name=value`
_NAMED = re.compile(r"`([a-z_][a-z0-9_]*)(?:=([^`]*))?`")


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    # argparse lists a parser's options only in the private _actions (no public accessor)
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)parser of the command ``args`` ran (``moment data synth``'s for ``data synth``)."""
    p = parser
    while True:
        sub = _subparsers(p)
        word = getattr(args, sub.dest, None) if sub is not None else None
        nxt = sub.choices.get(word) if sub is not None and word is not None else None
        if nxt is None:
            return p
        p = nxt


def command_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The command ``args`` ran (``"data synth"``) and its options: ``dest`` -> the longest option string.

    The options are those of the sub-parsers ``args`` went through, the command's own last.
    """
    words: list[str] = []
    options: dict[str, str] = {}
    p: argparse.ArgumentParser | None = parser
    while p is not None:
        for a in p._actions:
            if a.option_strings and a.dest != "help":
                options[a.dest] = max(a.option_strings, key=len)
        sub = _subparsers(p)
        word = getattr(args, sub.dest, None) if sub is not None else None
        p = sub.choices.get(word) if sub is not None and word is not None else None
        if p is not None and word is not None:
            words.append(word)
    return " ".join(words), options


def in_flags(message: str, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``message`` with each parameter the library names in backticks as the option that sets it.

    Parameters
    ----------
    message : str
        A library error's one line.
    parser : argparse.ArgumentParser
        The top-level parser of ``moment``.
    args : argparse.Namespace
        What ``parser`` parsed: which command (and sub-command) ran.

    Returns
    -------
    str
        The line with `` `name` `` as ``--flag``, `` `name=value` `` as ``--flag value``
        (inside the quotes of an option of another command, `` `moment place --force` ``)
        and `` `name=True` `` as ``--flag``, and each library call of :data:`CALLS` as its
        command; names no option of the command sets stay as they are.
    """
    command, options = command_options(parser, args)
    options = {**ALIASES[""], **options, **ALIASES.get(command, {})}
    for call, words in CALLS.items():
        message = message.replace(f"`{call}`", words)

    def flag(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        option = options.get(name)
        if option is None:
            return m.group(0)
        if value is None or value == "True":
            return option
        # an option of another command, quoted as a whole: its value goes inside the quotes
        return f"{option[:-1]} {value}`" if option.endswith("`") else f"{option} {value}"

    return _NAMED.sub(flag, message)
