"""A simulated InfiniBand port: counters in the units sysfs reports, consistent with traffic.

Traffic comes from the fleet (the job's all-reduce bytes over this rail); faults lower the rate
(slow_nic: the link trained at half speed, congestion shows as xmit_wait) or flap the link
(nic_link_flap: link_downed and link_error_recovery step up, symbol errors climb). A degrading
switch hits every port beneath it (errors: symbol errors and link recoveries at the port's full
rate; rate: the port trains at a lower rate and waits for credit); a slow uplink makes the ports
below its leaf wait in proportion to the share of their traffic that crosses it. Busy healthy
ports wait a little too (1% of the fault scale at full load), as real ones do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NDR_BYTES_PER_S = 50e9  # 400 Gb/s
MTU_BYTES = 4096
PORT_ACTIVE, PORT_DOWN = 4, 1
PHYS_LINK_UP, PHYS_POLLING = 5, 2
#: port_xmit_wait ticks per second of a port that cannot send at all (slow_nic at 0.5 waits half that).
XMIT_WAIT_TICKS_PER_S = 2e7
#: Of that, what a healthy port at full load waits (credit stalls of ordinary traffic).
BACKGROUND_WAIT_SHARE = 0.01
#: Symbol errors per second of a port under a switch degrading with `errors` (over 1,000/h).
SWITCH_SYMBOL_ERRORS_PER_S = 0.3


@dataclass
class NicFaults:
    slow: float = 0.0          # fractional loss of throughput
    flapping: bool = False
    errors: bool = False       # under a degrading switch: symbol errors, link recoveries
    rate_loss: float = 0.0     # under a degrading switch: share of the link rate lost (0.5: 400 -> 200 Gb/s)
    congestion: float = 0.0    # share of the time waiting for credit on a slow uplink


@dataclass
class SimulatedNic:
    index: int
    rng: np.random.Generator
    device: str = ""
    bytes_per_s: float = 0.0            # offered load per direction
    faults: NicFaults = field(default_factory=NicFaults)
    xmit_bytes: float = 0.0
    rcv_bytes: float = 0.0
    xmit_packets: float = 0.0
    rcv_packets: float = 0.0
    symbol_error: float = 0.0
    link_error_recovery: float = 0.0
    link_downed: float = 0.0
    port_rcv_errors: float = 0.0
    xmit_wait: float = 0.0
    port_xmit_discards: float = 0.0
    state: int = PORT_ACTIVE
    phys_state: int = PHYS_LINK_UP
    _since_flap: float = 0.0

    def __post_init__(self) -> None:
        self.device = self.device or f"mlx5_{self.index}"

    @property
    def rate_bytes_per_s(self) -> float:
        return NDR_BYTES_PER_S * (0.5 if self.faults.slow > 0 else 1.0) * (1 - self.faults.rate_loss)

    def advance(self, dt: float) -> None:
        if dt <= 0:
            return
        f = self.faults
        moved = min(self.bytes_per_s, self.rate_bytes_per_s) * dt * (1 - f.slow)
        self.state, self.phys_state = PORT_ACTIVE, PHYS_LINK_UP
        if f.flapping:
            self._since_flap += dt
            if self._since_flap >= 60:  # one flap a minute while the fault lasts
                self._since_flap = 0.0
                self.link_downed += 1
                self.link_error_recovery += 2
                self.state, self.phys_state = PORT_DOWN, PHYS_POLLING
                moved *= 0.8
            self.symbol_error += self.rng.poisson(0.5 * dt)
        if f.slow > 0:
            self.symbol_error += self.rng.poisson(0.2 * dt)   # 720/h: over the IBTA 120/h
            self.port_rcv_errors += self.rng.poisson(0.02 * dt)
            self.xmit_wait += XMIT_WAIT_TICKS_PER_S * dt * f.slow
        elif self.rng.random() < 0.001 * dt:
            self.symbol_error += 1                             # healthy links see the odd error
        self._switch_faults(dt)
        self.xmit_bytes += moved
        self.rcv_bytes += moved
        self.xmit_packets += moved / MTU_BYTES
        self.rcv_packets += moved / MTU_BYTES

    def _switch_faults(self, dt: float) -> None:
        """What a degrading switch or a slow uplink does to this port, and the background waits."""
        f = self.faults
        if f.errors:
            self.symbol_error += self.rng.poisson(SWITCH_SYMBOL_ERRORS_PER_S * dt)
            self.link_error_recovery += self.rng.poisson(0.01 * dt)
            self.port_rcv_errors += self.rng.poisson(0.05 * dt)
        load = min(1.0, self.bytes_per_s / self.rate_bytes_per_s) if self.bytes_per_s > 0 else 0.0
        wait = BACKGROUND_WAIT_SHARE * load
        if f.rate_loss > 0 and self.bytes_per_s > 0:
            wait += f.rate_loss
        if f.congestion > 0 and self.bytes_per_s > 0:
            wait += f.congestion
        self.xmit_wait += XMIT_WAIT_TICKS_PER_S * min(1.0, wait) * dt
