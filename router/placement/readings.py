"""What a GPU reader reports: plain values, so that budgets are computed without any driver."""

from __future__ import annotations

import attrs


@attrs.frozen
class ProcessUse:
    """One process holding GPU memory; ``used`` is None where the driver does not say how much."""

    pid: int
    used: int | None


@attrs.frozen
class GpuReading:
    """One GPU as the driver reports it right now (bytes; ``util`` in percent, None when unknown).

    ``processes`` is None where the driver cannot list the processes on the GPU.
    """

    index: int
    total: int
    used: int
    name: str = ""
    bus_id: str = ""
    util: float | None = None
    processes: tuple[ProcessUse, ...] | None = None

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)
