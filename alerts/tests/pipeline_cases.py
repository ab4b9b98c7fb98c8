"""Writes the templates of alerts/tests/pipeline.yml and pipeline-ticket.yml
(flopwatch/mixin/templates/tests/): promtool cases for peer groups, stage imbalance and lost time.

Run `python alerts/tests/pipeline_cases.py`, then `flopwatch rules build --out alerts`, after changing
a case; tests/test_rules.py fails when the committed template differs from what this writes. Runbook
URLs and severities are the mixin's settings (`[[ runbooks ]]`, `[[ sev.page ]]`). Every job runs
steps of a fixed length; per rank the generator lays out counters of steps and phases as a client
would send them, so each case states only what a person would: each stage's compute time per step,
a bad worker, comm floors.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flopwatch.train.wire import ARRIVAL_PHASES

INTERVAL_S = 5
SAMPLES = 186          # 15.5 minutes: the last check is at 15m (promtool evaluates every rule every 5 s)
OUT = Path(__file__).resolve().parents[2] / "flopwatch" / "mixin" / "templates" / "tests" / "pipeline.yml"
#: A stage imbalance ticket that must not fire is watched for 15 minutes (10 after the lost-time
#: records' 5-minute windows fill): evaluated every 30 s, as Prometheus runs the pipeline group,
#: not every 5 s with the straggler rules (promtool evaluates every loaded rule at every step).
TICKET_OUT = OUT.with_name("pipeline-ticket.yml")
TICKET_INTERVAL_S = 30
COLLECTIVE_S = 0.1     # the collective's own time per step
OPTIMIZER_S = 0.05


@dataclass
class Job:
    """A job of `stages` x `dp` ranks (rank = stage * dp + dp_rank), one node per stage."""

    job_id: str
    stages: int
    dp: int
    compute: list[float]                      # per stage, seconds per step
    slow: dict[int, float] = field(default_factory=dict)   # rank -> compute seconds per step
    comm_floor: float | None = None           # what clients send as their shortest comm of a step
    scatter: float = 0.0                      # mean extra wait per step from a moving slowest rank

    def arrival(self, rank: int) -> float:
        return self.slow.get(rank, self.compute[rank // self.dp])

    def step_seconds(self) -> float:
        return max(self.arrival(r) for r in range(self.stages * self.dp)) + COLLECTIVE_S + self.scatter + OPTIMIZER_S

    def series(self) -> list[dict[str, str]]:
        out, step = [], self.step_seconds()
        steps_per_sample = INTERVAL_S / step
        for rank in range(self.stages * self.dp):
            stage, dp_rank = divmod(rank, self.dp)
            labels = (f'node="{self.job_id}-n{stage}",job_id="{self.job_id}",rank="{rank}",gpu="{dp_rank}",'
                      f'stage="{stage}",dp_rank="{dp_rank}",instance="{self.job_id}-n{stage}:9847",job="flopwatch"')
            compute = self.arrival(rank)
            phases = {"data": 0.0, "compute": compute, "other": 0.0, "optimizer": OPTIMIZER_S,
                      "comm": step - compute - OPTIMIZER_S}
            out.append(_counter(f"flopwatch_train_steps_total{{{labels}}}", steps_per_sample))
            for phase, seconds in phases.items():
                name = f'flopwatch_train_phase_seconds_total{{{labels},phase="{phase}"}}'
                out.append(_counter(name, seconds * steps_per_sample))
            arrival = sum(phases[phase] for phase in ARRIVAL_PHASES)   # the agent's sum of them
            out.append(_counter(f"flopwatch_train_arrival_seconds_total{{{labels}}}", arrival * steps_per_sample))
            if self.comm_floor is not None:
                out.append({"series": f"flopwatch_train_comm_min_seconds{{{labels}}}",
                            "values": f"{self.comm_floor:g}x{SAMPLES}"})
        for stage in range(self.stages):
            node = f"{self.job_id}-n{stage}"
            labels = f'node="{node}",job_id="{self.job_id}",instance="{node}:9847",job="flopwatch"'
            per_sample = self.dp * steps_per_sample
            out.append(_counter(f"flopwatch_train_step_seconds_sum{{{labels}}}", per_sample * step))
            out.append(_counter(f"flopwatch_train_step_seconds_count{{{labels}}}", per_sample))
        return out


def _counter(name: str, per_sample: float) -> dict[str, str]:
    return {"series": name, "values": f"0+{per_sample:.15g}x{SAMPLES}"}


def _straggler(job: Job, rank: int, description: str, summary: str) -> dict:
    stage, dp_rank = divmod(rank, job.dp)
    return {"exp_labels": {"alertname": "FlopWatchStraggler", "severity": "[[ sev.page ]]", "detector": "rank_only",
                           "cause": "unknown", "job_id": job.job_id, "node": f"{job.job_id}-n{stage}",
                           "gpu": str(dp_rank), "rank": str(rank), "stage": str(stage), "dp_rank": str(dp_rank)},
            "exp_annotations": {"summary": summary, "description": description, "evidence": "peers",
                                "runbook_url": "[[ runbooks ]]#flopwatchstraggler"}}


HEAVY_LAST = Job("heavy-last", stages=4, dp=4, compute=[0.5, 0.5, 0.5, 0.6], comm_floor=COLLECTIVE_S)
BAD_WORKER = Job("bad-worker", stages=2, dp=4, compute=[0.5, 0.53], slow={0: 1.0})
SCATTERED = Job("scattered", stages=1, dp=8, compute=[0.5], comm_floor=COLLECTIVE_S, scatter=0.2)


def _rounded(expr: str, eval_time: str, samples: list[tuple[str, float]]) -> dict:
    """A promql_expr_test on round(expr, 1e-4): promtool compares floats exactly."""
    return {"expr": f"round({expr}, 0.0001)", "eval_time": eval_time,
            "exp_samples": [{"labels": labels, "value": round(value, 4)} for labels, value in samples]}


def cases() -> dict:
    def at(minutes: float) -> str:
        return f"{int(minutes)}m" + (f"{round(minutes % 1 * 60)}s" if minutes % 1 else "")

    # FlopWatchPipelineImbalance holds `for` 10 minutes; the heavy stage's condition holds from the
    # first evaluations (10 s in), so its ticket is checked at 10m30s.
    ticket = 10.5
    imbalance = {
        "name": "a heavy last stage is a ticket naming the stage, never a straggler page",
        "interval": f"{INTERVAL_S}s", "input_series": HEAVY_LAST.series(),
        "promql_expr_test": [
            _rounded('job_id_stage:flopwatch_stage_imbalance:ratio{job_id="heavy-last"}', at(5),
                     [(f'{{job_id="heavy-last",stage="{stage}"}}', value)
                      for stage, value in ((0, 1), (1, 1), (2, 1), (3, 1.2))]),
            # comm per step 0.2 (stages 0-2) and 0.1 (stage 3, the floor); (0.175 - 0.1) / 0.75 s per step
            _rounded('job_id_class:flopwatch_step_time_lost:ratio{job_id="heavy-last"}', at(6),
                     [(f'{{job_id="heavy-last",class="{c}"}}', v) for c, v in (("stage", 0.1), ("worker", 0),
                                                                               ("scattered", 0))]),
            _rounded('job_id:flopwatch_step_time_lost:ratio{job_id="heavy-last"}', at(6),
                     [('{job_id="heavy-last"}', 0.1)]),
        ],
        "alert_rule_test": [
            {"alertname": "FlopWatchStraggler", "eval_time": at(m), "exp_alerts": []} for m in (3, 8, ticket)
        ] + [
            {"alertname": "FlopWatchPipelineImbalance", "eval_time": at(8), "exp_alerts": []},
            {"alertname": "FlopWatchPipelineImbalance", "eval_time": at(ticket), "exp_alerts": [{
                "exp_labels": {"alertname": "FlopWatchPipelineImbalance", "severity": "[[ sev.ticket ]]",
                               "job_id": "heavy-last", "stage": "3"},
                "exp_annotations": {
                    "summary": "Job heavy-last: pipeline stage 3 is 20% slower than the fastest stage",
                    "description": (
                        "The ranks of pipeline stage 3 of job heavy-last take 20% longer per step to reach their "
                        "collectives than those of the job's fastest stage, so the other stages wait for it every "
                        "micro-batch. Stage imbalance costs 10% of the job's step time (0.075 s of each step). "
                        "Nothing is broken: move layers out of stage 3 (Megatron-LM: "
                        "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers, or account for "
                        "the embedding and loss layers), or use interleaved (virtual) pipeline stages."),
                    "runbook_url": "[[ runbooks ]]#flopwatchpipelineimbalance"}}]},
        ],
    }
    description = ("Rank 0 of job bad-worker on bad-worker-n0 GPU 0 takes 100% longer per step to reach the "
                   "gradient collective than the median rank of its peers in pipeline stage 0 (of 8 ranks in the "
                   "job); every other rank waits for it, so the whole job runs that much slower. Probable cause: "
                   "unknown - no telemetry of its GPU or node explains it.")
    bad_worker = {
        "name": "a bad worker is paged against its stage's peers (pipeline-ticket.yml: the slightly heavier stage is "
                "not ticketed)",
        "interval": f"{INTERVAL_S}s", "input_series": BAD_WORKER.series(),
        "alert_rule_test": [
            {"alertname": "FlopWatchStraggler", "eval_time": at(4), "exp_alerts": [_straggler(
                BAD_WORKER, 0, description,
                "Straggler in job bad-worker: bad-worker-n0 GPU 0 (rank 0) 100% slower, cause unknown")]},
        ],
        # no comm floor from the clients: the least mean comm of a rank (the bad worker's) stands in
        # comm per step: 0.1 (the bad worker), 0.6 x 3 (its peers), 0.57 x 4 (stage 1): mean 0.5225,
        # least 0.1, stage medians 0.6 and 0.57; 1.15 s per step. No comm floor from these clients:
        # the least mean comm of a rank (the bad worker's) stands in.
        "promql_expr_test": [
            _rounded('job_id_class:flopwatch_step_time_lost:ratio{job_id="bad-worker"}', at(6),
                     [(f'{{job_id="bad-worker",class="{c}"}}', v)
                      for c, v in (("worker", (0.5225 - 0.1 - 0.015) / 1.15), ("stage", 0.015 / 1.15),
                                   ("scattered", 0))]),
        ],
    }
    scattered = {
        "name": "waits from a slowest rank that moves every step count as scattered imbalance, never paged",
        "interval": f"{INTERVAL_S}s", "input_series": SCATTERED.series(),
        # every rank waits 0.2 s per step on average beyond the collective's 0.1 s; clients saw 0.1 s
        "promql_expr_test": [
            _rounded('job_id_class:flopwatch_step_time_lost:ratio{job_id="scattered"}', at(6),
                     [(f'{{job_id="scattered",class="{c}"}}', v)
                      for c, v in (("scattered", 0.2 / 0.85), ("stage", 0), ("worker", 0))]),
        ],
        # 8m: past the straggler rules' longest window (a 5-minute maximum of a 2-minute spread) from the start
        "alert_rule_test": [{"alertname": "FlopWatchStraggler", "eval_time": at(m), "exp_alerts": []} for m in (3, 8)],
    }
    return {"rule_files": ["../flopwatch-stragglers.yml", "../flopwatch-goodput.yml"],
            "evaluation_interval": f"{INTERVAL_S}s", "tests": [imbalance, bad_worker, scattered]}


def ticket_cases() -> dict:
    return {"rule_files": ["../flopwatch-stragglers.yml", "../flopwatch-goodput.yml"],
            "evaluation_interval": f"{TICKET_INTERVAL_S}s", "tests": [{
                "name": "the slightly heavier stage of a job with a bad worker is not ticketed (pipeline.yml: the bad "
                        "worker is paged)",
                "interval": f"{INTERVAL_S}s", "input_series": BAD_WORKER.series(),
                "alert_rule_test": [{"alertname": "FlopWatchPipelineImbalance", "eval_time": "15m", "exp_alerts": []}],
            }]}


HEAD = "# Generated by pipeline_cases.py beside this file: edit the cases there, then run it.\n"


def render() -> str:
    return HEAD + yaml.safe_dump(cases(), sort_keys=False, width=200)


def render_ticket() -> str:
    head = HEAD + ("# The stage imbalance ticket that must not fire, watched for 15 minutes (10 after the lost-time\n"
                   "# records' 5-minute windows fill) at the pipeline rules' own 30 s: promtool evaluates every\n"
                   "# loaded rule at every step, and at pipeline.yml's 5 s (the straggler rules') that is 181 steps.\n")
    return head + yaml.safe_dump(ticket_cases(), sort_keys=False, width=200)


def outputs() -> dict[Path, str]:
    """Every template this writes, with its text."""
    return {OUT: render(), TICKET_OUT: render_ticket()}


if __name__ == "__main__":
    for out, text in outputs().items():
        out.write_text(text)
        sys.stdout.write(f"wrote {out}\n")
