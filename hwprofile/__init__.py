"""hwprofile: measure what can be measured on the machine at hand (the paper's §3.1 profiling).

The planner's flow model needs the capacity of every link and device. Tables
give the PCIe figures; this package measures the rest where it can:

- :func:`ssd_random_read` (:mod:`hwprofile.ssd`): random aligned reads of
  ``block_bytes`` from a file on a storage device, with fio (``io_uring``,
  else ``libaio``, else ``psync``) when it is installed *and* with the
  reader the feature store uses, iostack's ``posix`` backend
  (``moment-posix``), O_DIRECT where the file system allows it;
- :func:`host_memory_bandwidth` / :func:`memory_bandwidth_by_node`
  (:mod:`hwprofile.memory`): DRAM bandwidth from a numpy copy (STREAM "copy"
  convention: bytes read plus bytes written, per second);
- :func:`cuda_bandwidths` (:mod:`hwprofile.cuda`): host→device,
  device→host and peer copies, on a machine with CUDA and PyTorch only;
- :func:`~hwprofile.gpureads.add_device_read_figures` (:mod:`hwprofile.gpureads`): each
  read backend's reads into GPU memory, what ``--backend auto`` chooses by (CUDA only);
- :func:`profile_machine` (:mod:`hwprofile.machine`): all of it, as a
  :class:`ProfileSpec` (an :class:`SsdProbe`, a :class:`MemoryProbe`) says, as
  :class:`~planner.capacities.Capacities` keyed by the devices the test
  files live on.

It sits above iostack (whose reader it measures) and beside training in the
one-way import order (``docs/architecture.md``); ``moment profile`` calls
it. Library code: results are returned and progress goes to an optional
callback taking one line of text; nothing is printed. Failures a user can
cause (a missing directory, no space, a read-only file system) raise
:class:`~planner.errors.ProfileError`.

>>> host_memory_bandwidth(8 << 20, repeats=2) > 0
True
"""

from hwprofile.cuda import cuda_bandwidths
from hwprofile.machine import MemoryProbe, ProfileSpec, SsdProbe, profile_machine
from hwprofile.memory import host_memory_bandwidth, memory_bandwidth_by_node
from hwprofile.ssd import (
    DEFAULT_FILE_BYTES,
    SsdMeasurement,
    posix_random_read,
    ssd_random_read,
    write_test_file,
)
from planner.errors import ProfileError

__all__ = [
    "ProfileError", "SsdMeasurement", "DEFAULT_FILE_BYTES",
    "ssd_random_read", "write_test_file", "posix_random_read",
    "host_memory_bandwidth", "memory_bandwidth_by_node", "cuda_bandwidths", "profile_machine", "ProfileSpec",
    "SsdProbe", "MemoryProbe",
]
