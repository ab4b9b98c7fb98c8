"""The names other parts rely on, in one place: every alert (each has a runbook anchor
`#<name in lower case>` in docs/runbooks.md) and the recording rules of the shared contract.
A test fails when the built rules define a different set of alerts or lack a contract record;
the dashboards and the runbook checks read these lists. Also the docs' address, the one spelling of it."""

from __future__ import annotations

#: Where the project's docs live (the default of the mixin's urls.docs, the dashboards' links) and its
#: runbooks (urls.runbooks: every alert's runbook_url is <RUNBOOKS_URL>#<alert in lower case>).
DOCS_URL = "https://github.com/flopwatch/flopwatch/blob/main/docs"
RUNBOOKS_URL = f"{DOCS_URL}/runbooks.md"

ALERTS: tuple[str, ...] = (
    "FlopWatchStraggler", "FlopWatchGpuXidCritical", "FlopWatchGpuXid", "FlopWatchGpuLost",
    "FlopWatchGpuEccUncorrected", "FlopWatchGpuRowRemapFailure", "FlopWatchNvlinkErrors",
    "FlopWatchPcieDegraded", "FlopWatchGpuThrottled", "FlopWatchIbSymbolErrors", "FlopWatchIbLinkDowned",
    "FlopWatchIbLinkFlapping", "FlopWatchJobMfuRegression", "FlopWatchTrainingStalled",
    "FlopWatchGoodputLow", "FlopWatchIdleAllocatedGpus", "FlopWatchAgentDown", "FlopWatchCollectorErrors",
    "FlopWatchScrapeIntervalTooCoarse",
    "FlopWatchPipelineImbalance", "FlopWatchCheckpointIntervalOff",
    "FlopWatchSwitchDegraded", "FlopWatchUplinkDegraded", "FlopWatchSpineDegraded",
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
