"""The report's energy and cost section: kWh, power, tokens per kWh and costs per cluster and job."""

from __future__ import annotations

from flopwatch.report.facts import JOULES_PER_KWH, Facts
from flopwatch.report.format import sentence
from flopwatch.report.model import Chart, Column, Figure, Section, Series, Table
from flopwatch.report.sections import cluster_name, energy_cost, failed_notes, gpu_cost, total_cost
from flopwatch.report.settings import ReportSettings


def energy(facts: Facts, settings: ReportSettings, errors: dict[str, str]) -> Section:
    section = Section("energy", "Energy and cost",
                      intro="GPU energy from the driver's energy counters (board power of the GPUs, not the whole "
                            "node). Cost = GPU-hours × price per GPU-hour + kWh × price per kWh.")
    kwh = facts.total("energy_kwh")
    section.figures = _energy_figures(facts, settings)
    section.tables = [_energy_by_cluster(facts, settings), _energy_by_job(facts, settings)]
    power = _power_chart(facts)
    if power.series:
        section.charts.append(power)
    section.notes += [f"{sentence(cluster_name(cf.cluster))} reports no energy counter "
                      "(flopwatch_gpu_energy_joules_total, Volta and newer): its energy is estimated from "
                      "average power × window." for cf in facts.clusters.values() if cf.energy_estimated]
    if kwh is None:
        section.notes.append("No GPU energy or power in this window (flopwatch_gpu_energy_joules_total, "
                             "flopwatch_gpu_power_watts): no energy figures.")
    if settings.price_kwh is None and settings.price_gpu_hour is None:
        section.notes.append("No prices configured: pass --price-kwh and --price-gpu-hour (or set them in --config) "
                             "for costs.")
    section.notes += failed_notes(errors, ("energy_total", "job_energy", "idle_energy"))
    return section


def _kwh(joules: float | None) -> float | None:
    return joules / JOULES_PER_KWH if joules is not None else None


def _energy_figures(facts: Facts, settings: ReportSettings) -> list[Figure]:
    hours = facts.window.hours
    kwh = facts.total("energy_kwh")
    tokens = facts.total("tokens")
    idle_hours = sum(cf.unallocated_hours + cf.allocated_idle_hours for cf in facts.clusters.values())
    idle_joules = [cf.idle_energy_j for cf in facts.clusters.values() if cf.idle_energy_j is not None]
    idle_kwh = _kwh(sum(idle_joules)) if idle_joules else None
    return [
        Figure("Energy (kWh)", kwh, "kwh"),
        Figure("Average GPU power (kW)", kwh / hours if kwh is not None else None, "float"),
        Figure("Tokens per kWh", tokens / kwh if tokens and kwh else None, "si"),
        Figure("Energy cost", energy_cost(kwh, settings), "money",
               "" if settings.price_kwh is not None else "set --price-kwh"),
        Figure("GPU cost", gpu_cost(facts.total("gpu_hours"), settings), "money",
               "" if settings.price_gpu_hour is not None else "set --price-gpu-hour"),
        Figure("Idle GPU cost", total_cost(idle_hours, idle_kwh, settings), "money",
               f"{idle_hours:,.0f} idle GPU-hours"),
    ]


def _energy_by_cluster(facts: Facts, settings: ReportSettings) -> Table:
    hours = facts.window.hours
    table = Table("energy_by_cluster", "Per cluster", [
        Column("cluster", "Cluster"), Column("kwh", "kWh", "kwh"), Column("avg_kw", "Average kW", "float"),
        Column("idle_kwh", "kWh of unallocated GPUs", "kwh"), Column("tokens_per_kwh", "Tokens per kWh", "si"),
        Column("energy_cost", "Energy cost", "money"), Column("gpu_cost", "GPU cost", "money"),
        Column("idle_cost", "Idle GPU cost", "money"),
    ])
    for cf in facts.clusters.values():
        kwh, idle_kwh = cf.energy_kwh, _kwh(cf.idle_energy_j)
        table.rows.append({
            "cluster": cluster_name(cf.cluster), "kwh": kwh, "avg_kw": kwh / hours if kwh is not None else None,
            "idle_kwh": idle_kwh, "tokens_per_kwh": cf.tokens / kwh if cf.tokens and kwh else None,
            "energy_cost": energy_cost(kwh, settings), "gpu_cost": gpu_cost(cf.gpu_hours, settings),
            "idle_cost": total_cost(cf.unallocated_hours + cf.allocated_idle_hours, idle_kwh, settings),
        })
    return table


def _energy_by_job(facts: Facts, settings: ReportSettings) -> Table:
    table = Table("energy_by_job", "Per job", [
        Column("cluster", "Cluster"), Column("job_id", "Job"), Column("kwh", "kWh", "kwh"),
        Column("tokens", "Tokens", "si"), Column("tokens_per_kwh", "Tokens per kWh", "si"),
        Column("energy_cost", "Energy cost", "money"), Column("gpu_cost", "GPU cost", "money"),
        Column("cost", "Total", "money"),
    ], empty="no job held a GPU in this window")
    for job in facts.ranked_jobs():
        table.rows.append({
            "cluster": cluster_name(job.cluster), "job_id": job.job_id, "kwh": job.energy_kwh, "tokens": job.tokens,
            "tokens_per_kwh": job.tokens_per_kwh, "energy_cost": energy_cost(job.energy_kwh, settings),
            "gpu_cost": gpu_cost(job.gpu_hours, settings),
            "cost": total_cost(job.gpu_hours, job.energy_kwh, settings),
        })
    return table


def _power_chart(facts: Facts) -> Chart:
    grid = facts.grid
    return Chart("power", "GPU power over time (kW)", "line", "float", [
        Series(f"{cluster_name(cf.cluster)} kW", grid.times.tolist(), (cf.energy_series / grid.step / 1000).tolist())
        for cf in facts.clusters.values() if cf.energy_series is not None
    ])
