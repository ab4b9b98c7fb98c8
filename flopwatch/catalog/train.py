"""Training-step telemetry: what only the training process knows, received by the agent's intake.

Per (job_id, rank) counters come straight from the client's own running totals (carried in every
datagram), so a lost datagram loses no steps, tokens or FLOPs; a restarted training process shows
up as an ordinary counter reset. `gpu` is the rank's GPU index on this node (from the process's
CUDA device or its local_rank) so rules can join to GPU series on (node, gpu); it is empty where
unknown. `stage` is the rank's pipeline stage ("0" for a rank that did not say: a one-stage job)
and `dp_rank` its data-parallel rank (empty where unknown), so rules compare a rank with its peers
(same job and stage) rather than with the whole job. The fleet simulator emits exactly these series
for simulated jobs.

MFU per job = sum(rate(flopwatch_train_model_flops_total)) / sum(GPUs x peak dense FLOP/s).
The straggler is the rank with the most `compute` (or the least `comm`) phase seconds per step.
"""

from flopwatch.catalog.metric import Metric
from flopwatch.train.wire import STEP_BUCKETS  # clients keep the histogram, so the wire owns buckets

RANK = ("job_id", "rank", "gpu", "stage", "dp_rank")

STEPS = Metric(
    "flopwatch_train_steps_total", "counter", "",
    "Training steps completed by this rank (the client's running count).", RANK,
)
TOKENS = Metric(
    "flopwatch_train_tokens_total", "counter", "",
    "Tokens processed by this rank's steps (tokens_per_step as the client declared it).", RANK,
)
MODEL_FLOPS = Metric(
    "flopwatch_train_model_flops_total", "counter", "",
    "Model FLOPs of this rank's steps (6N + 12·L·H·Q·T per token, or measured once with "
    "FlopCounterMode); recomputation excluded. The MFU numerator.", RANK,
)
HARDWARE_FLOPS = Metric(
    "flopwatch_train_hardware_flops_total", "counter", "",
    "FLOPs the hardware executed for this rank's steps, activation recomputation included. The HFU "
    "numerator; equals model FLOPs when nothing is recomputed.", RANK,
)
PHASE_SECONDS = Metric(
    "flopwatch_train_phase_seconds_total", "counter", "seconds",
    "Wall time of this rank's steps by phase: data, compute (forward and backward up to the "
    "gradient collective), comm (waiting in the collective), optimizer, other (the untimed rest). "
    "The phases of a step add up to its step time.", (*RANK, "phase"),
)
ARRIVAL_SECONDS = Metric(
    "flopwatch_train_arrival_seconds_total", "counter", "seconds",
    "Wall time of this rank's steps before it reaches the gradient collective: its data, compute "
    "and other phase seconds summed. Straggler rules compare it across peers every few seconds, and "
    "one series per rank costs them a third of reading the three phases.", RANK,
)
#: The recent window the agent keeps per rank (RECENT_ARRIVAL, RECENT_PHASE): the rank's steps of
#: about the last RECENT_WINDOW_S seconds before its latest report, and never fewer than
#: RECENT_MIN_STEPS of them (steps longer than the window are measured over the last two); the
#: gauges go away once the rank has reported no step for RECENT_STALE_S (no step, no score).
RECENT_WINDOW_S = 10.0
RECENT_MIN_STEPS = 2
RECENT_STALE_S = 30.0


def starts_recent_window(seconds_before: float, steps_before: float) -> bool:
    """Whether a report this far before a rank's latest can start its recent window: the one rule
    the agent's intake and the simulator both apply."""
    return seconds_before >= RECENT_WINDOW_S and steps_before >= RECENT_MIN_STEPS


#: The host-side phases RECENT_PHASE carries: the straggler rules' data_phase and other_phase causes.
RECENT_PHASES: tuple[str, ...] = ("data", "other")
RECENT_ARRIVAL = Metric(
    "flopwatch_train_recent_arrival_seconds", "gauge", "seconds",
    "Arrival seconds per step of this rank's recent steps (data, compute and other phases: the time "
    f"before it reaches the gradient collective), over its steps of about the last {RECENT_WINDOW_S:g} s "
    f"before its latest report and at least its last {RECENT_MIN_STEPS}: the difference of its running "
    f"totals between that report and the newest earlier one at least {RECENT_WINDOW_S:g} s and "
    f"{RECENT_MIN_STEPS} steps older, over the steps between them. The agent sees every report, so this "
    "is current within a step, where a rule's increase over scraped counters lags by its window; the "
    "straggler rules' fast score reads it. Absent until the rank has such a window, and once it has "
    f"reported no step for {RECENT_STALE_S:g} s.", RANK,
)
RECENT_PHASE = Metric(
    "flopwatch_train_recent_phase_seconds", "gauge", "seconds",
    "Seconds per step of this rank's recent steps in one host-side phase (data: loading the batch; "
    "other: host work outside data loading and GPU compute), over the same steps as "
    "flopwatch_train_recent_arrival_seconds: a straggler whose excess sits in one of them is named "
    "with that cause.", (*RANK, "phase"),
)
CHECKPOINT_SECONDS = Metric(
    "flopwatch_train_checkpoint_seconds_total", "counter", "seconds",
    "Time this rank spent saving or restoring checkpoints, by kind (save, restore).", (*RANK, "kind"),
)
JOB_PHASE_SECONDS = Metric(
    "flopwatch_train_job_phase_seconds_total", "counter", "seconds",
    "flopwatch_train_phase_seconds_total summed over this job's ranks on this node, by phase. It never "
    "goes back while the agent runs: a rank whose totals start over (its process restarted) or that "
    "went quiet keeps what it had counted in the sum. Goodput reads one series per node and phase "
    "where per-rank phases cost it one per rank.", ("job_id", "phase"),
)
JOB_CHECKPOINT_SECONDS = Metric(
    "flopwatch_train_job_checkpoint_seconds_total", "counter", "seconds",
    "flopwatch_train_checkpoint_seconds_total summed over this job's ranks on this node, by kind "
    "(save, restore), kept as flopwatch_train_job_phase_seconds_total is.", ("job_id", "kind"),
)
COMM_MIN = Metric(
    "flopwatch_train_comm_min_seconds", "gauge", "seconds",
    "Shortest comm phase of one step of this rank over its last completed block of 16 steps: in a "
    "step where this rank arrived last, its comm time is the collective's own, with no wait for "
    "others. The job's minimum is the floor against which per-step waiting for stragglers is "
    "measured.", RANK,
)
ITERATION = Metric(
    "flopwatch_train_iteration", "gauge", "",
    "The training iteration (global step) of this rank's last step, as the job counts it: after a "
    "restart from a checkpoint it starts below the iteration reached before, and steps done again "
    "until it passes that mark are lost progress. Absent for clients that do not report it.", RANK,
)
REPLAYED_STEPS = Metric(
    "flopwatch_train_replayed_steps_total", "counter", "",
    "Steps of this job's ranks on this node that redid iterations a rank had reached before (it "
    "restarted from an older checkpoint, in a new process or in place), counted by the agent as they "
    "arrive, so a replay shorter than any rule's window is still seen. The agent remembers each "
    "rank's highest iteration while the job runs on this node; across the agent's own restarts the "
    "rules' one-day high-water mark of flopwatch_train_iteration takes over. Present for jobs whose "
    "clients report their iteration.", ("job_id",),
)
REPLAYED_STEP_SECONDS = Metric(
    "flopwatch_train_replayed_step_seconds_total", "counter", "seconds",
    "Step wall time of those replayed steps, summed over the job's ranks on this node as "
    "flopwatch_train_step_seconds_sum is: its increase over that of the histogram's sum is the "
    "share of step time lost to redoing iterations (lost progress).", ("job_id",),
)
JOB_RANKS = Metric(
    "flopwatch_train_job_ranks", "gauge", "",
    "Ranks in the whole job as its clients declare it (pipeline stages x tensor-parallel x "
    "data-parallel size), the largest any of its ranks on this node declares. A Prometheus that "
    "scrapes only some of a large job's nodes (one shard of several) judges their ranks as ranks of "
    "a job this large. Absent for clients that do not say their data-parallel size.", ("job_id",),
)
LAST_STEP = Metric(
    "flopwatch_train_last_step_timestamp_seconds", "gauge", "seconds",
    "Unix time the agent received this rank's last completed step (a hang shows as a growing age).",
    RANK,
)
STEP_SECONDS = Metric(
    "flopwatch_train_step_seconds", "histogram", "seconds",
    "Step wall time per job on this node, from the histograms the ranks keep themselves (lossless); "
    "every rank observes each of its steps, so the count is steps x ranks.", ("job_id",),
    buckets=STEP_BUCKETS,
)
FLOPS_PER_STEP = Metric(
    "flopwatch_train_model_flops_per_step", "gauge", "",
    "Model FLOPs of one step of this rank by method: analytic (6N + 12·L·H·Q·T) and measured "
    "(torch FlopCounterMode), side by side when the client has both.", ("job_id", "rank", "method"),
)
CLIENT_DROPPED = Metric(
    "flopwatch_train_client_dropped_events_total", "counter", "",
    "Datagrams the training client could not hand to the agent (agent down, socket missing, queue "
    "full), as reported by the client in a later datagram. Totals stay exact: every datagram "
    "carries running counts.", ("job_id", "rank"),
)
EVENTS_ACCEPTED = Metric(
    "flopwatch_train_events_accepted_total", "counter", "",
    "Datagrams from training clients that the intake accepted.",
)
EVENTS_REJECTED = Metric(
    "flopwatch_train_events_rejected_total", "counter", "",
    "Datagrams the intake refused, by reason: truncated, oversized, version, malformed, "
    "unknown_phase, bad_job_id, bad_rank, bad_coordinates (a pipeline stage, data- or tensor-parallel "
    "rank outside its size), duplicate_coordinates (a second rank of the job on this node claiming "
    "the same stage, data- and tensor-parallel rank), bad_value, non_monotonic, too_many_jobs, "
    "too_many_ranks, rate_limited.", ("reason",),
)
