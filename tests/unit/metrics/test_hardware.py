"""The benchmarks' read floors divide by the card's own peak bandwidth."""

import pytest

from ddtree.metrics.hardware import CARD_BANDWIDTH, H200_BANDWIDTH, read_bandwidth


@pytest.mark.parametrize("name, tbs", [
    ("NVIDIA H200", 4.8), ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0), ("NVIDIA H100 NVL", 3.9),
    ("NVIDIA A100-SXM4-80GB", 2.039), ("NVIDIA RTX A6000", 0.768),
])
def test_a_known_card_reads_at_its_own_peak(name, tbs):
    """An H100 reads 1.4x slower than the H200 the issues' bars assume: its floor must not use the H200's rate."""
    assert read_bandwidth(name) == pytest.approx(tbs * 1e12)


def test_an_unknown_card_gets_the_h200_and_a_given_rate_wins():
    assert read_bandwidth("Some Future GPU") == H200_BANDWIDTH == 4.8e12
    assert read_bandwidth("", None) == H200_BANDWIDTH  # the CPU
    assert read_bandwidth("NVIDIA H100 80GB HBM3", given=4.8) == 4.8e12
    with pytest.raises(ValueError, match="positive number of TB/s"):
        read_bandwidth("NVIDIA H200", given=0)


def test_the_more_specific_names_come_first():
    """A substring match takes the first entry, so "H100 PCIe" must precede "H100" (and so on)."""
    keys = [key for key, _ in CARD_BANDWIDTH]
    for i, key in enumerate(keys):
        assert not any(earlier in key for earlier in keys[:i]), key
