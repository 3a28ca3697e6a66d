"""LLVM intrinsics numba does not offer on CPU: atomics on an ``int64`` element, a prefetch.

``atomic_min`` and ``compare_and_swap`` emit LLVM's ``atomicrmw min`` and ``cmpxchg`` (``lock
cmpxchg`` on x86) on ``a[i]`` of a 1-D ``int64`` array, for kernels run on several threads.
A locked instruction is a fence: no later load starts before it ends, so a loop of them
waits out one cache miss after another; ``prefetch`` (``llvm.prefetch``, not ordered by
fences) asks for a line some iterations ahead (measured: 2 M atomic mins into a 400 MB
array, 44 ms plain, 22 ms prefetching 16 ahead). Imported only by
:mod:`training._sample_kernels` (importing numba is slow).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _pointer(context, builder, aryty, ary, i):  # noqa: ANN001, ANN202 — numba codegen objects
    return cgutils.get_item_pointer(context, builder, aryty, context.make_array(aryty)(context, builder, ary), [i],
                                    boundscheck=False)


@intrinsic
def prefetch(typingctx, a, i):  # noqa: ANN001, ANN201, ARG001 — numba's intrinsic signature
    """Ask for the cache line of ``a[i]`` (for reading soon); never faults, so
    ``i`` may be anything."""
    if not (isinstance(a, types.Array) and a.ndim == 1):
        return None
    sig = types.void(a, types.intp)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        i8p = builder.bitcast(_pointer(context, builder, signature.args[0], args[0], args[1]),
                              ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p.type, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [i8p, i32(0), i32(3), i32(1)])  # read, keep in all caches, data
        return context.get_dummy_value()

    return sig, codegen


def _read_modify_write(op: str, ordering: str, doc: str):  # noqa: ANN202 — a numba intrinsic
    """An intrinsic ``f(a, i, v)``: ``a[i] = op(a[i], v)`` atomically, returning the old ``a[i]``."""

    def rmw(typingctx, a, i, v):  # noqa: ANN001, ANN202, ARG001 — numba's intrinsic signature
        if not (isinstance(a, types.Array) and a.dtype == types.int64 and a.ndim == 1):
            return None
        sig = types.int64(a, types.intp, types.int64)

        def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
            ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
            return builder.atomic_rmw(op, ptr, args[2], ordering)

        return sig, codegen

    rmw.__doc__ = doc
    rmw.__name__ = rmw.__qualname__ = f"atomic_{op}"
    return intrinsic(rmw)


#: ``atomic_min(a, i, v)``: ``a[i] = min(a[i], v)`` (signed), atomically; returns the old ``a[i]``
atomic_min = _read_modify_write("min", "monotonic", "a[i] = min(a[i], v) atomically; returns the old a[i]")
#: ``atomic_add(a, i, v)``: ``a[i] += v`` atomically, ordered (``v = 0``: a read that fences); the old ``a[i]``
atomic_add = _read_modify_write("add", "seq_cst", "a[i] += v atomically; returns the old a[i]")


@intrinsic
def compare_and_swap(typingctx, a, i, old, new):  # noqa: ANN001, ANN201, ARG001 — numba's intrinsic signature
    """If ``a[i] == old``, ``a[i] = new``, atomically; returns the ``a[i]`` found (== ``old``: swapped)."""
    if not (isinstance(a, types.Array) and a.dtype == types.int64 and a.ndim == 1):
        return None
    sig = types.int64(a, types.intp, types.int64, types.int64)

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        ptr = _pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.extract_value(builder.cmpxchg(ptr, args[2], args[3], "monotonic", "monotonic"), 0)

    return sig, codegen
