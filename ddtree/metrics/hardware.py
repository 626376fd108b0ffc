"""What a GPU can at best read per second: the denominator of the benchmarks' read floors.

A decode step at batch 1 must at least read every weight (and the K/V it attends over) once, so its
floor is those bytes over the card's peak memory bandwidth. The issues' bars are stated for an H200;
an H100 SXM reads 1.4x slower, and a floor computed at the H200's rate reads that much too high there.
"""

from __future__ import annotations

H200_BANDWIDTH = 4.8e12  # bytes/s: the H200's HBM3e peak, the floor's denominator where the card is not known
# Peak memory bandwidth, bytes/s, by a substring of ``torch.cuda.get_device_name()``: the first match wins.
CARD_BANDWIDTH = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
                  ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12),
                  ("RTX A6000", 0.768e12), ("L40S", 0.864e12))


def read_bandwidth(device_name: str, given: float | None = None) -> float:
    """The floor's bandwidth in bytes/s: ``given`` (TB/s) where set, else the card's peak from
    ``CARD_BANDWIDTH``, else ``H200_BANDWIDTH`` (the card the issues' bars assume).

    >>> read_bandwidth("NVIDIA H100 80GB HBM3") / 1e12, read_bandwidth("NVIDIA H200") / 1e12
    (3.35, 4.8)
    >>> read_bandwidth("NVIDIA H100 80GB HBM3", given=4.8) / 1e12
    4.8
    """
    if given is not None:
        if not float(given) > 0:
            raise ValueError(f"read_bandwidth must be a positive number of TB/s (an H200 reads 4.8), got {given!r}")
        return float(given) * 1e12
    return next((bw for key, bw in CARD_BANDWIDTH if key in device_name), H200_BANDWIDTH)
