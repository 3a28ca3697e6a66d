"""What the asynchronous engines (:mod:`._aio`, :mod:`._uring`) share: the reads of one call and their completions.

An engine call reads ``nbytes[i]`` at ``offsets[i]`` to address ``addrs[i]`` for every
``i``. A completion reports ``res``: the bytes read, or ``-errno``. :meth:`Reads.settle`
sorts a batch of completions into finished reads, short reads to continue (a regular
file gives one only at its end or under memory pressure; a pipe any time) and errors,
with numpy over the whole batch: no Python loop per completion.

>>> import numpy as np
>>> r = Reads(np.array([0, 4096]), np.array([4096, 4096]), np.array([1 << 20, 2 << 20]))
>>> done, again = r.settle(np.array([1, 0]), np.array([4096, 1000]))
>>> done.tolist(), again.tolist(), int(r.off[0]), int(r.left[0]), int(r.addr[0]) - (1 << 20)
([1], [0], 1000, 3096, 1000)
>>> r.settle(np.array([0]), np.array([0]))
Traceback (most recent call last):
...
OSError: [Errno 5] read of 4096 bytes at offset 0 hit the end of the file
"""

from __future__ import annotations

import errno
import os

import numpy as np

_NONE = np.zeros(0, np.intp)


class Reads:
    """The reads of one engine call: where each continues (``off``, ``addr``) and how much is left (``left``).

    ``offset_ignored``: the file has no offsets (a pipe): a continued read keeps offset 0.
    """

    def __init__(self, offsets: np.ndarray, nbytes: np.ndarray, addrs: np.ndarray,
                 offset_ignored: bool = False) -> None:
        self.off = np.array(offsets, np.uint64).reshape(-1)
        self.left = np.array(nbytes, np.int64).reshape(-1)
        self.addr = np.array(addrs, np.uint64).reshape(-1)
        self.start = self.off.copy()  # for messages: where each read began
        self.size = self.left.copy()
        self.offset_ignored = offset_ignored
        if not self.off.size == self.left.size == self.addr.size:
            raise ValueError(f"offsets, nbytes and addrs differ in length "
                             f"({self.off.size}, {self.left.size}, {self.addr.size})")

    def __len__(self) -> int:
        return int(self.off.size)

    def settle(self, idx: np.ndarray, res: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Completions ``res`` of reads ``idx``: (the reads now complete, the short reads to submit again).

        A short read is advanced past what it got (``off``, ``addr``, ``left``) before it
        is returned. Raises OSError for an error (its errno) or a read that got 0 bytes
        (the end of the file) or more than it asked for.
        """
        want = self.left[idx]
        if np.array_equal(res, want):
            return idx, _NONE
        bad = res != want
        i, got = idx[bad].astype(np.intp), np.asarray(res[bad], np.int64)
        failed = np.flatnonzero(got < 0)
        if failed.size:
            j, e = int(i[failed[0]]), int(-got[failed[0]])
            raise OSError(e, f"read at offset {int(self.start[j])}: {os.strerror(e)}")
        over = np.flatnonzero((got == 0) | (got > want[bad]))
        if over.size:
            j = int(i[over[0]])
            raise OSError(errno.EIO, f"read of {int(self.size[j])} bytes at offset {int(self.start[j])} "
                                     "hit the end of the file")
        if not self.offset_ignored:
            self.off[i] += got.astype(np.uint64)
        self.addr[i] += got.astype(np.uint64)
        self.left[i] -= got
        return idx[~bad], i
