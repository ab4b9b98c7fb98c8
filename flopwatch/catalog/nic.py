"""Network interfaces: RDMA ports (InfiniBand and RoCE, from /sys/class/infiniband) and Ethernet
interfaces (from /sys/class/net).

RDMA series carry `device` (e.g. mlx5_0) and `port` (1-based); Ethernet series carry `device`
(the interface name). The two are kept in separate families because a RoCE port and its Ethernet
interface count the same wire twice: never add them up.
"""

from flopwatch.catalog.metric import Metric

PORT = ("device", "port")
NET = ("device",)

# -- RDMA ports (InfiniBand, RoCE) ---------------------------------------------------------------
INFO = Metric(
    "flopwatch_nic_info", "gauge", "",
    "Always 1; one series per RDMA port with its link layer (InfiniBand or Ethernet for RoCE), "
    "firmware version, HCA type and board ID.",
    ("device", "port", "link_layer", "firmware_version", "hca_type", "board_id"),
)
COUNTERS_AVAILABLE = Metric(
    "flopwatch_nic_counters_available", "gauge", "",
    "1 when the port exposes the standard IB port counters, 0 when the device shows an empty or "
    "missing counters directory (some RoCE NICs): its byte and error series are then absent, not 0.",
    PORT,
)
PORT_STATE = Metric(
    "flopwatch_nic_port_state", "gauge", "",
    "Logical port state as the kernel's number (1 down, 2 init, 3 armed, 4 active, 5 active_defer); "
    "`state` carries the kernel's word.", ("device", "port", "state"),
)
PORT_PHYSICAL_STATE = Metric(
    "flopwatch_nic_port_physical_state", "gauge", "",
    "Physical port state as the kernel's number (2 polling, 3 disabled, 5 link up, 6 link error "
    "recovery, ...); `state` carries the kernel's word.", ("device", "port", "state"),
)
PORT_RATE = Metric(
    "flopwatch_nic_port_rate_bytes_per_second", "gauge", "bytes_per_second",
    "Negotiated port rate (the sysfs `rate` in Gb/s, converted to bytes per second).", PORT,
)
DATA = Metric(
    "flopwatch_nic_data_bytes_total", "counter", "bytes",
    "Data bytes through the port (port_xmit_data/port_rcv_data count 4-byte words: multiplied by "
    "4; the 64-bit counters_ext variants are preferred where the kernel offers them).",
    ("device", "port", "direction"),
)
PACKETS = Metric(
    "flopwatch_nic_packets_total", "counter", "",
    "Packets through the port (64-bit counters_ext variants preferred).",
    ("device", "port", "direction"),
)
ERRORS = Metric(
    "flopwatch_nic_port_errors_total", "counter", "",
    "IB port error counters, `counter` naming the sysfs file: symbol_error, link_error_recovery, "
    "port_rcv_errors, local_link_integrity_errors, excessive_buffer_overrun_errors, "
    "port_xmit_discards, port_rcv_remote_physical_errors, port_rcv_switch_relay_errors, "
    "port_xmit_constraint_errors, port_rcv_constraint_errors, VL15_dropped. IBTA allows 120 "
    "symbol errors an hour: alert on rates.", ("device", "port", "counter"),
)
LINK_DOWNED = Metric(
    "flopwatch_nic_link_downed_total", "counter", "",
    "Times the port's link went down (sysfs link_downed); any increase is worth a look.", PORT,
)
XMIT_WAIT = Metric(
    "flopwatch_nic_xmit_wait_total", "counter", "",
    "Ticks the port had data to send but could not (sysfs port_xmit_wait): congestion or a slow "
    "peer upstream.", PORT,
)
HW_COUNTERS = Metric(
    "flopwatch_nic_hw_events_total", "counter", "",
    "Driver hw_counters of the port (RoCE congestion and transport), `counter` naming the file: "
    "np_ecn_marked_roce_packets, np_cnp_sent, rp_cnp_handled, rp_cnp_ignored, out_of_sequence, "
    "local_ack_timeout_err, roce_slow_restart, packet_seq_err, implied_nak_seq_err, "
    "rnr_nak_retry_err, roce_adp_retrans, ...", ("device", "port", "counter"),
    availability="NICs whose driver exposes hw_counters (mlx5, irdma, ...)",
)

# -- Ethernet interfaces ---------------------------------------------------------------------------
NET_UP = Metric(
    "flopwatch_nic_net_up", "gauge", "",
    "1 when the interface's operstate is up, else 0; `operstate` carries the kernel's word.",
    ("device", "operstate"),
)
NET_SPEED = Metric(
    "flopwatch_nic_net_speed_bytes_per_second", "gauge", "bytes_per_second",
    "Link speed (sysfs `speed` in Mb/s, converted); absent while the kernel reports none (-1).", NET,
)
NET_BYTES = Metric(
    "flopwatch_nic_net_bytes_total", "counter", "bytes",
    "Bytes through the interface (statistics/rx_bytes, tx_bytes).", ("device", "direction"),
)
NET_PACKETS = Metric(
    "flopwatch_nic_net_packets_total", "counter", "",
    "Packets through the interface (statistics/rx_packets, tx_packets).", ("device", "direction"),
)
NET_ERRORS = Metric(
    "flopwatch_nic_net_errors_total", "counter", "",
    "Errored packets (statistics/rx_errors, tx_errors).", ("device", "direction"),
)
NET_DROPS = Metric(
    "flopwatch_nic_net_drops_total", "counter", "",
    "Dropped packets (statistics/rx_dropped, tx_dropped).", ("device", "direction"),
)
