"""Bytes per step per rank (tf_dlrm.sharding.traffic): hand-computed cases."""

import pytest

from tf_dlrm.sharding.traffic import describe, ring_allreduce_sent, step_traffic


def test_two_ranks_hand_computed():
    # local batch 4; rank 0 sends 3 columns, rank 1 sends 5; float32 values.
    zero, one = step_traffic([3, 5], global_batch_size=8, exchange_bytes_per_value=4, allreduce_payload_bytes=1000)
    assert zero.alltoall_forward_sent == 1 * 4 * 3 * 4 == 48
    assert zero.alltoall_forward_received == 4 * 5 * 4 == 80
    assert (zero.alltoall_backward_sent, zero.alltoall_backward_received) == (80, 48)
    assert one.alltoall_forward_sent == 80 and one.alltoall_forward_received == 48
    assert zero.allreduce_sent == one.allreduce_sent == 1000  # 2 (N-1)/N P with N = 2
    assert zero.total_sent == 48 + 80 + 1000


def test_everything_sent_is_received():
    traffic = step_traffic([7, 1, 4, 9], global_batch_size=16, exchange_bytes_per_value=2, allreduce_payload_bytes=0)
    assert sum(t.alltoall_forward_sent for t in traffic) == sum(t.alltoall_forward_received for t in traffic)
    assert traffic[3].alltoall_forward_sent == 3 * 4 * 9 * 2


def test_one_rank_moves_nothing():
    (only,) = step_traffic([128], global_batch_size=8, exchange_bytes_per_value=4, allreduce_payload_bytes=10**6)
    assert only.total_sent == 0 and only.allreduce_payload == 10**6


def test_ring_allreduce():
    assert ring_allreduce_sent(1200, 4) == 1800
    assert ring_allreduce_sent(1200, 1) == 0


@pytest.mark.parametrize("arguments, message", [
    (([], 8, 4, 0), "at least one rank"),
    (([1, 2], 7, 4, 0), "global_batch_size=7"),
    (([1, -2], 8, 4, 0), "send_widths"),
    (([1, 2], 8, 0, 0), "exchange_bytes_per_value"),
])
def test_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        step_traffic(*arguments)


def test_describe_names_every_rank():
    text = describe(step_traffic([3, 5], 8, 4, 1000))
    assert "rank 0:" in text and "rank 1:" in text and "allreduce payload 1,000" in text
