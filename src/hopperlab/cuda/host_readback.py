"""Small device results that the host must read in the middle of a step, read without the
copy engine.

An MoE layer needs its tokens per expert on the host to cut the tokens into segments.
``tensor.tolist()`` gets them with a device->host ``cudaMemcpyAsync``; while activation offload
keeps the device->host direction busy with gigabytes of copies, that 16-byte copy waits behind
them, and so does the host and the rest of the forward it would launch (measured with nsys:
docs/benchmarks/moe.md). Here an elementwise kernel on the compute stream stores the values into
page-locked host memory mapped into the GPU's address space (under unified addressing a
``cudaHostAlloc``'d pointer is valid on the device as is), and the host waits for the compute
stream alone. Without CUDA it is ``tolist()``.
"""

from __future__ import annotations

import torch

from hopperlab.cuda.runtime import CudaArray


class HostReadback:
    """Reads small integer tensors of one device onto the host through mapped pinned memory.

    Example::

        readback = HostReadback(capacity=8)
        sizes = readback.read(torch.bincount(expert_ids, minlength=8))   # a list of ints
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._host: torch.Tensor | None = None     # pinned int64 [capacity]
        self._alias: torch.Tensor | None = None    # the same memory as a CUDA tensor
        self._device: torch.device | None = None

    def __deepcopy__(self, memo: dict) -> "HostReadback":
        return HostReadback(self.capacity)     # its own mapped memory, made when first used

    def read(self, t: torch.Tensor) -> list[int]:
        """``t.tolist()`` for a 1-D integer tensor of at most ``capacity`` elements."""
        if not t.is_cuda:
            return t.tolist()
        if t.dim() != 1 or t.numel() > self.capacity or t.is_floating_point():
            raise ValueError(f"HostReadback reads 1-D integer tensors of at most {self.capacity} "
                             f"elements, got {t.dtype} {tuple(t.shape)}")
        alias = self._alias_on(t.device)[: t.numel()]
        # an elementwise kernel (not a copy): the SMs store over the link, no copy engine queue
        torch.add(t.to(torch.int64), 0, out=alias)
        torch.cuda.current_stream(t.device).synchronize()
        return self._host[: t.numel()].tolist()

    def _alias_on(self, device: torch.device) -> torch.Tensor:
        if self._alias is None or self._device != device:
            self._host = torch.zeros(self.capacity, dtype=torch.int64, pin_memory=True)
            nbytes = self.capacity * self._host.element_size()
            with torch.cuda.device(device):
                self._alias = torch.as_tensor(CudaArray(self._host.data_ptr(), nbytes),
                                              device=device).view(torch.int64)
            self._device = device
        return self._alias
