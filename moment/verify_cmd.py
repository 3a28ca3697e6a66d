"""``moment place --verify DIR`` and ``moment data info --verify DIR``: every block checked, bad files listed.

Thin: :mod:`training.verify` reads and checks; this prints a line per file
checked (or the report as JSON) and returns the exit status: 0 when every file
is good, 1 when any is bad (a placement or dataset that cannot be read at all is
an error, exit 2, as every command's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.verify import VerifyReport


def add_verify_option(group: argparse._ArgumentGroup) -> None:
    """``moment place --verify DIR`` (with it, ``--dataset``, the cache sizes and ``--out`` are not needed)."""
    group.add_argument("--verify", metavar="DIR",
                       help="place nothing: check every block of every SSD bin of the placement in DIR and of "
                            "every array of its dataset against their checksums; list the bad ones (exit 1)")


def is_placement(directory: str) -> bool:
    """Whether ``directory`` holds a placement (one machine's or a sharded one) rather than a dataset."""
    from iostack.placement import MANIFEST
    from iostack.shards import SHARDS

    return any((Path(directory) / n).exists() for n in (MANIFEST, SHARDS))


def verify(directory: str, *, as_json: bool, placement: bool) -> tuple[int, VerifyReport]:
    """Check ``directory`` (a placement with its dataset, or a dataset), print what is bad; the exit status
    and the report."""
    from moment.bars import Bars
    from training.verify import verify_dataset, verify_placement

    with Bars(quiet=as_json, transient=True, unit="B") as bars:
        rep = verify_placement(directory, progress=bars) if placement else verify_dataset(directory, progress=bars)
    return (0 if rep.ok else 1), rep


def print_report(rep: VerifyReport, *, file=None) -> None:
    """One line per file checked (bad ones with their blocks), the notes, and a last line with the counts."""
    from training.verify import describe

    out = file if file is not None else sys.stdout
    for f in rep.files:
        if f.ok:
            how = f"{f.blocks:,} blocks" if f.blocks else "whole file"
            out.write(f"ok   {f.what:<22} {how:<14} {f.path}\n")
        else:
            out.write(f"BAD  {f.what:<22} {describe(f)}\n")
        if f.note:
            out.write(f"     note: {f.note}\n")
    for note in rep.notes:
        out.write(f"note: {note}\n")
    blocks = sum(f.blocks for f in rep.files)
    bad = rep.bad
    if bad:
        out.write(f"{len(bad)} of {len(rep.files)} files are corrupt ({sum(len(f.bad_blocks) for f in bad):,} bad "
                  f"blocks); re-run `moment place` for a bin, re-import or regenerate the dataset for its arrays\n")
    else:
        out.write(f"all {len(rep.files)} files good ({blocks:,} blocks checked)\n")


def require_unless_verify(args: argparse.Namespace, options: tuple[str, ...]) -> None:
    """What argparse's ``required=True`` would say, for options required unless ``--verify`` is given.

    Raises
    ------
    CommandError
        When some of ``options`` are missing.
    """
    from moment.errors import CommandError

    missing = [o for o in options if getattr(args, o.lstrip("-").replace("-", "_"), None) is None]
    if missing:
        raise CommandError(f"the following arguments are required: {', '.join(missing)} "
                           "(or --verify DIR to check a placement)")


def verify_for_info(directory: str, *, as_json: bool) -> tuple[int | None, str | None]:
    """``moment data info --verify DIR``: a placement is checked as ``moment place --verify`` checks it (the
    exit status, no sentence); a dataset: a bad one is reported (exit 1), a good one gives the sentence for
    the info's integrity line (status None: go on)."""
    if is_placement(directory):
        return run_place_verify(directory, as_json=as_json), None
    code, rep = verify(directory, as_json=as_json, placement=False)
    if code:
        if as_json:
            sys.stdout.write(json.dumps(rep.to_dict(), indent=2) + "\n")
        else:
            print_report(rep)
        return code, None
    if not rep.files:
        return None, "; ".join(rep.notes)
    blocks = sum(f.blocks for f in rep.files)
    return None, f"CRC-32 verified: all {blocks:,} block(s) of {len(rep.files)} file(s)"


def run_place_verify(directory: str, *, as_json: bool) -> int:
    """``moment place --verify DIR``: the placement's bins and its dataset's arrays."""
    code, rep = verify(directory, as_json=as_json, placement=True)
    if as_json:
        sys.stdout.write(json.dumps(rep.to_dict(), indent=2) + "\n")
    else:
        print_report(rep)
    return code


__all__ = ["add_verify_option", "is_placement", "print_report", "require_unless_verify", "run_place_verify",
           "verify", "verify_for_info"]
