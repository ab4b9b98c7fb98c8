"""Job attribution: which GPUs (and NIC rails) belong to which job, so rules can join per-GPU
series to `job_id`.

Several jobs sharing a GPU (MPS, time-slicing, MIG slices of one GPU) give several info series
for that GPU; a GPU no source claims has none.
"""

from flopwatch.catalog.metric import Metric

GPU_JOB_INFO = Metric(
    "flopwatch_gpu_job_info", "gauge", "",
    "Always 1 while the job holds the GPU. Join with the info series on the many side, "
    "`flopwatch_gpu_job_info * on(node, gpu) group_left <gpu series>`, so a GPU shared by several "
    "jobs yields one result per job. Sources in order: the Slurm prolog/epilog mapping directory, "
    "the environment of the processes on the GPU, the kubelet pod-resources socket "
    "(job_id namespace/pod).",
    ("gpu", "job_id", "user"),
)
NIC_JOB_INFO = Metric(
    "flopwatch_nic_job_info", "gauge", "",
    "Always 1 while a job holds a GPU whose NIC rail this port is (attribution.nic_rails).",
    ("device", "port", "job_id", "user"),
)
ATTRIBUTION_SKIPPED = Metric(
    "flopwatch_job_attribution_skipped_total", "counter", "",
    "Inputs the attribution collector could not use, by source (mapping_dir, process_env, "
    "kubelet) and reason (bad_name, unreadable, unknown_device, unreachable, ...).",
    ("source", "reason"),
)
