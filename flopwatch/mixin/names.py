"""The names other parts rely on, in one place: every alert (each has a runbook anchor
`#<name in lower case>` in docs/runbooks.md) and the recording rules of the shared contract.
A test fails when the built rules define a different set of alerts or lack a contract record;
the dashboards and the runbook checks read these lists."""

from __future__ import annotations

ALERTS: tuple[str, ...] = (
    "FlopWatchStraggler", "FlopWatchGpuXidCritical", "FlopWatchGpuXid", "FlopWatchGpuLost",
    "FlopWatchGpuEccUncorrected", "FlopWatchGpuRowRemapFailure", "FlopWatchNvlinkErrors",
    "FlopWatchPcieDegraded", "FlopWatchGpuThrottled", "FlopWatchIbSymbolErrors", "FlopWatchIbLinkDowned",
    "FlopWatchIbLinkFlapping", "FlopWatchJobMfuRegression", "FlopWatchTrainingStalled",
    "FlopWatchGoodputLow", "FlopWatchIdleAllocatedGpus", "FlopWatchAgentDown", "FlopWatchCollectorErrors",
    "FlopWatchPipelineImbalance", "FlopWatchCheckpointIntervalOff",
    "FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded",
)

CONTRACT_RECORDS: tuple[str, ...] = (
    "job_id:flopwatch_model_flops:rate1m", "job_id:flopwatch_hardware_flops:rate1m",
    "job_id:flopwatch_peak_flops:sum", "job_id:flopwatch_mfu:ratio", "job_id:flopwatch_hfu:ratio",
    "job_id:flopwatch_mfu_telemetry:ratio", "cluster:flopwatch_mfu:ratio", "fleet:flopwatch_mfu:ratio",
    "job_id:flopwatch_goodput:ratio", "job_id:flopwatch_badput:ratio", "job_id:flopwatch_step_seconds:mean1m",
    "job_id_rank:flopwatch_compute_seconds_per_step:rate1m", "job_id_rank:flopwatch_straggler_score:ratio",
    "node_gpu:flopwatch_gpu_straggler_score:ratio", "cluster:flopwatch_gpus:count",
    "job_id:flopwatch_step_time_lost:ratio", "job_id_class:flopwatch_step_time_lost:ratio",
    "job_id_stage:flopwatch_stage_imbalance:ratio",
)
