"""Is a run diverging? Two signs read from the epochs' mean training loss, checked at each epoch's end.

A run that diverges still finishes with exit status 0 and a poor accuracy, so the trainer
records what it sees in the epoch record (``divergence``) and ``moment train`` warns:

- **rising**: the epoch's loss is more than :data:`RISE` times the lowest loss of the
  epochs before it (a learning rate too high for the features' scale: GraphSAGE on raw
  Amazon Computers features at lr 0.01 went from 2.4 to 6.4);
- **at chance**: two epochs in a row within :data:`NEAR` of ``ln(num_classes)`` (the
  cross-entropy of a uniform guess) and the second not lower than the first by
  :data:`STUCK` of it: the model predicts nothing (the same run then sat at ln 10).

A first epoch near ``ln(num_classes)`` is normal (an untrained model guesses uniformly),
so nothing is said before a second epoch.

>>> check([2.4, 6.4], 10)["kind"]
'rising'
>>> check([2.31, 2.30], 10)["kind"]
'at chance'
>>> check([1.94, 1.70, 1.52], 7) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: a loss this many times the lowest before it is rising
RISE = 1.25
#: "near chance": within this share of ln(num_classes)
NEAR = 0.05
#: ... and falling by less than this share of it from one epoch to the next
STUCK = 0.02


def check(losses: Sequence[float], num_classes: int, *, lr: float | None = None) -> dict[str, str | float] | None:
    """The divergence seen in the epochs' mean losses ``losses`` (oldest first, the current last), or ``None``.

    Parameters
    ----------
    losses : sequence of float
        Mean training cross-entropy per epoch, in nats; the last is the epoch just ended.
    num_classes : int
        Classes of the labels (chance loss: ``ln(num_classes)``).
    lr : float, optional
        The run's learning rate, to suggest a tenth of it.

    Returns
    -------
    dict or None
        ``kind`` (``"rising"`` or ``"at chance"``), ``loss``, ``reference`` (the lowest loss
        before, or the chance loss) and ``message``: one line naming the likely fixes, with
        the parameters in backticks (``lr``, ``normalize_features``).
    """
    if len(losses) < 2 or not all(math.isfinite(x) for x in losses):
        return None
    now, before = float(losses[-1]), float(min(losses[:-1]))
    chance = math.log(num_classes) if num_classes > 1 else 0.0
    fixes = (f"a lower learning rate (`lr={lr / 10:g}`)" if lr else "a lower learning rate (`lr`)") + \
        " or normalized features (`normalize_features=True`)"
    if before > 0 and now > RISE * before:
        return {"kind": "rising", "loss": now, "reference": before,
                "message": f"the training loss rose to {now:.3f} from {before:.3f} (diverging); try {fixes}"}
    prev = float(losses[-2])
    near = chance > 0 and all(abs(x - chance) <= NEAR * chance for x in (prev, now))
    if near and now > prev - STUCK * chance:
        return {"kind": "at chance", "loss": now, "reference": chance,
                "message": f"the training loss is stuck at {now:.3f}, chance over {num_classes} classes "
                           f"(ln {num_classes} = {chance:.3f}): the model learns nothing; try {fixes}"}
    return None


__all__ = ["NEAR", "RISE", "STUCK", "check"]
