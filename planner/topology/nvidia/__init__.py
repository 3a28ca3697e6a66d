"""NVIDIA's views of a machine: ``nvidia-smi topo -m`` (:mod:`.smi`, its text read by
:mod:`.smi_matrix`), NVML (:mod:`.nvml`), NCCL's topology XML (:mod:`.nccl`), and the
NVLink figures they share (:mod:`.nvlink`)."""
