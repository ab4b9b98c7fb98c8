"""What every FlopWatch dashboard shares: the data source, template variables, units, thresholds,
links between dashboards and to the runbooks, and small panel factories over grafana-foundation-sdk.

Panel factories return the SDK's own builders with the title, description, unit and data source set,
so a dashboard module only adds its queries and the options that matter for that panel. Every
query goes through `query()`: PromQL with a legend, so the tests can check that the labels a legend
names come back from Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    FieldColor,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from flopwatch.catalog.gpu import CLOCK_EVENT_BITS
from flopwatch.mixin import names
from flopwatch.mixin.promql import clock_events_from_mask

#: Where the docs live for links from panels (runbooks) and the push command's --docs-url default
#: (flopwatch/mixin/names.py, the one spelling; `flopwatch rules build` takes urls.docs instead).
DOCS_URL = names.DOCS_URL
TAG = "flopwatch"

#: Alert names (the rules/dashboards contract, flopwatch/mixin/names.py); each has a runbook anchor
#: `#<name lower-case>`.
ALERTS: tuple[str, ...] = names.ALERTS

#: Recording rules the panels read (owned by alerts/; names from the shared contract).
RULES: tuple[str, ...] = (
    "job_id:flopwatch_mfu:ratio", "job_id:flopwatch_hfu:ratio", "job_id:flopwatch_mfu_telemetry:ratio",
    "job_id:flopwatch_model_flops:rate1m", "job_id:flopwatch_peak_flops:sum",
    "cluster:flopwatch_mfu:ratio", "fleet:flopwatch_mfu:ratio",
    "job_id:flopwatch_goodput:ratio", "job_id:flopwatch_badput:ratio", "job_id:flopwatch_step_seconds:mean1m",
    "job_id_rank:flopwatch_compute_seconds_per_step:rate1m", "job_id_rank:flopwatch_straggler_score:ratio",
    "node_gpu:flopwatch_gpu_straggler_score:ratio", "cluster:flopwatch_gpus:count",
    "job_id_class:flopwatch_step_time_lost:ratio", "job_id_stage:flopwatch_arrival_seconds_per_step:median2m",
    "job_id_rank:flopwatch_arrival_seconds_per_step:recent",
    # canonical per-GPU records (alerts/flopwatch-gpu.yml): the agent's series, else dcgm-exporter's
    "node_gpu:flopwatch_gpu_up:max", "job_id_gpu:flopwatch_gpu_job_info:max",
    "node_gpu:flopwatch_gpu_sm_clock_hertz:max", "node_gpu:flopwatch_gpu_sm_clock_max_hertz:max",
    "node_gpu:flopwatch_gpu_utilization_ratio:max", "node_gpu:flopwatch_gpu_tensor_active_ratio:max",
    "node_gpu:flopwatch_gpu_clock_event_reasons:max", "node_gpu_reason:flopwatch_gpu_clock_event_active:dcgm",
    "node_gpu:flopwatch_gpu_memory_clock_hertz:dcgm",
    "node_gpu:flopwatch_gpu_power_watts:max", "node_gpu:flopwatch_gpu_temperature_celsius:max",
    "node_gpu:flopwatch_gpu_memory_used_bytes:dcgm", "node_gpu_xid:flopwatch_gpu_xid_errors:dcgm",
    "node_gpu:flopwatch_gpu_ecc_uncorrected_errors:increase10m", "node_gpu:flopwatch_gpu_row_remap_failed:max",
    "node_gpu:flopwatch_gpu_pcie_link_width:max", "node_gpu:flopwatch_gpu_pcie_link_max_width:max",
    "node_gpu:flopwatch_gpu_pcie_link_generation:max", "node_gpu:flopwatch_gpu_pcie_link_max_generation:max",
    "node_gpu:flopwatch_gpu_pcie_replays:rate5m", "node_gpu:flopwatch_gpu_nvlink_bytes:rate1m",
    "node_gpu:flopwatch_gpu_nvlink_errors:sum_rate1m",
    # fabric records (alerts/flopwatch-fabric.yml): the topology joined with the NIC counters
    "node_port:flopwatch_fabric_link_info:max", "switch:flopwatch_fabric_uplink_info:max",
    "switch:flopwatch_fabric_ports:count", "switch:flopwatch_fabric_nodes:count",
    "switch:flopwatch_fabric_ports_erroring:ratio", "switch:flopwatch_fabric_ports_rate_degraded:ratio",
    "switch:flopwatch_fabric_ports_flapping:ratio", "switch:flopwatch_fabric_ports_xmit_wait:ratio",
    "switch_cause:flopwatch_fabric_shared_fault:priority", "node_port:flopwatch_nic_xmit_wait:rate1m",
    "fleet:flopwatch_nic_xmit_wait:median1m", "switch:flopwatch_fabric_leaves:count",
    "switch:flopwatch_fabric_leaves_uplink_congested:count",
)
#: The canonical records of every GPU and of the job holding it: panels and variables read these, not
#: flopwatch_gpu_up/flopwatch_gpu_job_info, so that they work on the agent and on dcgm-exporter alike.
UP = "node_gpu:flopwatch_gpu_up:max"
JOB_INFO = "job_id_gpu:flopwatch_gpu_job_info:max"

# --- units (Grafana unit ids) -------------------------------------------------------------------
PERCENT = "percentunit"      # 0..1 shown as %
SECONDS = "s"
HERTZ = "hertz"
WATTS = "watt"
WATT_HOURS = "watth"
CELSIUS = "celsius"
BYTES = "bytes"
BYTES_PER_SECOND = "Bps"
FLOPS = "flops"
COUNT = "short"
PER_SECOND = "suffix:/s"
PER_HOUR = "suffix:/h"
RATIO = "none"               # a plain ratio such as a straggler score (1.0 = the job's median)

# --- thresholds -------------------------------------------------------------------------------------
GREEN, YELLOW, ORANGE, RED, BLUE = "green", "yellow", "orange", "red", "blue"


def thresholds(base: str, *steps: tuple[float, str]) -> ThresholdsConfig:
    """Absolute thresholds: `base` below the first step, then each (value, colour) upwards."""
    return ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=None, color=base)] + [dm.Threshold(value=v, color=c) for v, c in steps])


#: MFU bands from published runs: GPT-3 21.3%, Megatron-Turing NLG 30.2% (PaLM table 3), Llama 3
#: 38-43%, PaLM 46.2%, MegaScale 55.2%. Best large runs sit at 40-55%.
MFU_BANDS = ((0.20, ORANGE), (0.30, YELLOW), (0.40, GREEN))
MFU_DESCRIPTION = (
    "Bands from published runs: red below 20%, orange 20-30% (GPT-3 21.3%, Megatron-Turing NLG 30.2%, "
    "PaLM table 3), yellow 30-40%, green from 40% (Llama 3 38-43%, PaLM 46.2%, MegaScale 55.2%: the "
    "best large runs sit at 40-55%)."
)
#: Goodput: Llama 3 kept > 90% effective training time; the FlopWatchGoodputLow alert fires below 80%.
GOODPUT_BANDS = ((0.80, YELLOW), (0.90, GREEN))
#: Straggler score (rank time per step over the job median): the alert floors are 2% with a
#: corroborating cause and 3% without (alerts/flopwatch-stragglers.yml).
SCORE_BANDS = ((1.02, YELLOW), (1.03, RED))

# --- data source and template variables ------------------------------------------------------------
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
ALL = dm.VariableOption(selected=True, text="All", value="$__all")


def datasource_variable() -> DatasourceVariable:
    return (DatasourceVariable("datasource").label("Data source").type("prometheus")
            .description("The Prometheus that scrapes the FlopWatch agents and evaluates alerts/*.yml."))


def query_variable(name: str, label: str, query: str, description: str, *, multi: bool) -> QueryVariable:
    """A label_values() variable; `multi` ones offer All (regex .*), so selectors use =~."""
    variable = (QueryVariable(name).label(label).description(description).datasource(DATASOURCE)
                .query(query).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(dm.VariableSort.NATURAL_ASC))
    if multi:
        variable = variable.multi(True).include_all(True).all_value(".*").current(ALL)
    return variable


def job_variable(*, multi: bool) -> QueryVariable:
    return query_variable("job_id", "Job", f"label_values({JOB_INFO}, job_id)",
                          "Training job holding GPUs (the agent's Slurm, process environment or kubelet "
                          "attribution, or dcgm-exporter's hpc_job or namespace/pod).", multi=multi)


def node_variable(selector: str = UP, *, multi: bool = True) -> QueryVariable:
    return query_variable("node", "Node", f"label_values({selector}, node)",
                          "Host name (the agent's node label, or dcgm-exporter's host label).", multi=multi)


def gpu_variable() -> QueryVariable:
    return query_variable("gpu", "GPU", f'label_values({UP}{{node=~"$node"}}, gpu)',
                          "GPU index on the node (NVML index; <gpu>.<instance> for a dcgm-exporter MIG "
                          "instance).", multi=True)


# --- links -----------------------------------------------------------------------------------------
def runbook_url(alert: str, docs_url: str = DOCS_URL) -> str:
    return f"{docs_url}/runbooks.md#{alert.lower()}"


def runbook_links(alerts: Iterable[str], docs_url: str = DOCS_URL) -> list[DashboardLink]:
    """Panel links to the runbook anchors of the alerts a panel shows the input of."""
    links = []
    for alert in alerts:
        if alert not in ALERTS:
            raise ValueError(f"{alert}: not an alert of the contract (common.ALERTS)")
        links.append(DashboardLink(f"Runbook: {alert}").type(dm.DashboardLinkType.LINK)
                     .url(runbook_url(alert, docs_url)).target_blank(True)
                     .tooltip(f"What {alert} means and what to do"))
    return links


def dashboard_links(docs_url: str = DOCS_URL) -> list[DashboardLink]:
    """Top-of-dashboard links: every FlopWatch dashboard (keeping variables and time), the runbooks."""
    return [
        DashboardLink("FlopWatch").type(dm.DashboardLinkType.DASHBOARDS).tags([TAG]).as_dropdown(True)
        .include_vars(True).keep_time(True).tooltip("The other FlopWatch dashboards"),
        DashboardLink("Runbooks").type(dm.DashboardLinkType.LINK).url(f"{docs_url}/runbooks.md")
        .icon("doc").target_blank(True).tooltip("One section per FlopWatch alert"),
    ]


def drill_link(title: str, uid: str, **variables: str) -> DashboardLink:
    """A data link to another FlopWatch dashboard, passing variables (Grafana ${...} expressions)."""
    params = "&".join(f"var-{name}={value}" for name, value in variables.items())
    return (DashboardLink(title).type(dm.DashboardLinkType.LINK)
            .url(f"/d/{uid}?{params}&${{__url_time_range}}"))


def external_link(title: str, url: str) -> DashboardLink:
    return DashboardLink(title).type(dm.DashboardLinkType.LINK).url(url).target_blank(True)


def with_runbook_label(expr: str) -> str:
    """Adds a `runbook` label (the alert's anchor, lower-case) to ALERTS-shaped results."""
    for alert in ALERTS:
        expr = f'label_replace({expr}, "runbook", "{alert.lower()}", "alertname", "{alert}")'
    return expr


# --- queries -----------------------------------------------------------------------------------------
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False,
          table_format: bool = False, heatmap_format: bool = False) -> Dataquery:
    """A Prometheus target. `legend` uses {{label}} placeholders; instant for stat/table panels."""
    target = Dataquery().expr(expr).ref_id(ref).legend_format(legend or "__auto")
    target = target.instant() if instant else target.range()
    if table_format:
        target = target.format(pm.PromQueryFormat.TABLE)
    elif heatmap_format:
        target = target.format(pm.PromQueryFormat.HEATMAP)
    return target


def increase_with_new(selector: str, window: str) -> str:
    """Increase of a counter over `window`, counting series that appear with their first event.

    The agent's XID counter appears at 1 when the first XID arrives, so increase() alone never sees
    it; a series absent an hour before the window counts with its whole value."""
    return (f"(increase({selector}[{window}]) > 0) or "
            f"({selector} unless last_over_time({selector}[1h] offset {window}))")


def rank_rows(expr: str, digits: int = 5) -> str:
    """One series per rank, in rank order: `rank` zero-padded and the other labels aggregated away.

    Prometheus sorts a result by its labels in name order (gpu before rank), and Grafana draws heat
    map rows in the order the series come; padding makes "00010" sort after "00009"."""
    return _padded(f"max by (rank) ({expr})", "rank", digits)


def stage_rows(record: str, matchers: str) -> str:
    """One series per (pipeline stage, dp rank) of `record{matchers}`, stage by stage and dp rank
    within it, in a `row` label ("003 dp 00012"): the What-if study's heat map, where one hot cell
    is a bad worker, a band a stage and scattered cells imbalance. A rank that gave no dp rank is
    shown by its rank."""
    known = f'max by (stage, dp_rank) ({record}{{{matchers}, dp_rank!=""}})'
    unknown = (f'max by (stage, dp_rank) (label_replace({record}{{{matchers}, dp_rank=""}}, '
               '"dp_rank", "$1", "rank", "(.*)"))')
    padded = _padded(_padded(f"({known} or {unknown})", "stage", 3), "dp_rank", 5)
    return f'max by (row) (label_join({padded}, "row", " dp ", "stage", "dp_rank"))'


def _padded(expr: str, label: str, digits: int) -> str:
    for width in range(1, digits):
        pattern = "([0-9])" if width == 1 else f"([0-9]{{{width}}})"
        expr = f'label_replace({expr}, "{label}", "{"0" * (digits - width)}$1", "{label}", "{pattern}")'
    return expr


def dcgm_total(record: str, selector: str, counter: str, label: str, by: str = "gpu") -> str:
    """`record{selector}` summed `by`, with `label`="total", for GPUs without the agent's `counter`: the
    part of a panel for dcgm-exporter GPUs, which report one figure per GPU where the agent splits it
    by direction or kind. `or` it with the agent's query; "total" never meets the agent's values."""
    return (f'label_replace(sum by ({by}) ({record}{{{selector}}} unless on (node, gpu) {counter}{{{selector}}}), '
            f'"{label}", "total", "", "")')


def dcgm_xids(selector: str, window: str = "") -> str:
    """dcgm-exporter's new XIDs (1 for the 5 minutes after its last-XID gauge shows a new code; the
    most over `window` when given) on GPUs the agent does not report: `or` it with the agent's
    counters, whose XIDs a fresh Prometheus also counts (the alerts' record does not)."""
    record = f"node_gpu_xid:flopwatch_gpu_xid_errors:dcgm{{{selector}}}"
    if window:
        record = f"max_over_time({record}[{window}])"
    return f"({record} unless on (node, gpu) flopwatch_gpu_up{{{selector}}})"


def clock_event_reasons(matchers: str, reasons: Iterable[str] = tuple(CLOCK_EVENT_BITS)) -> str:
    """The clock-event reasons of the GPUs `matchers` select (1 active, 0 not), decoded from their
    minute bitmask record; a GPU behind dcgm-exporter without the bitmask shows clock_below_max."""
    decoded = clock_events_from_mask(f"node_gpu:flopwatch_gpu_clock_event_reasons:max{{{matchers}}}", reasons)
    return (f"({decoded}) or on (node, gpu) "
            f'node_gpu_reason:flopwatch_gpu_clock_event_active:dcgm{{{matchers}, reason="clock_below_max"}}')


def on_job_gpus(expr: str) -> str:
    """Keep only series of GPUs the selected job holds (set filter: no many-to-many risk)."""
    return f'{expr} and on (node, gpu) {JOB_INFO}{{job_id=~"$job_id"}}'


# --- panels --------------------------------------------------------------------------------------
def _common(panel, title: str, description: str, unit: str, width: int, height: int):
    return (panel.title(title).description(description).unit(unit).datasource(DATASOURCE)
            .span(width).height(height))


def stat_panel(title: str, description: str, unit: str, *, width: int = 6, height: int = 5,
               trend: bool = True) -> stat.Panel:
    panel = _common(stat.Panel(), title, description, unit, width, height)
    return (panel.graph_mode(cm.BigValueGraphMode.AREA if trend else cm.BigValueGraphMode.NONE)
            .color_mode(cm.BigValueColorMode.VALUE)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))


def timeseries_panel(title: str, description: str, unit: str, *, width: int = 12, height: int = 8,
                     stacked: bool = False, bars: bool = False, show_thresholds: bool = False,
                     legend_table: bool = False) -> timeseries.Panel:
    panel = _common(timeseries.Panel(), title, description, unit, width, height)
    legend = (cb.VizLegendOptions().show_legend(True).placement(cm.LegendPlacement.BOTTOM)
              .display_mode(cm.LegendDisplayMode.TABLE if legend_table else cm.LegendDisplayMode.LIST))
    if legend_table:
        legend = legend.calcs(["mean", "max", "lastNotNull"]).sort_by("Last *").sort_desc(True)
    panel = panel.legend(legend).tooltip(
        cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL)).fill_opacity(40)
    else:
        panel = panel.fill_opacity(10)
    if bars:
        panel = panel.draw_style(cm.GraphDrawStyle.BARS).fill_opacity(80)
    if show_thresholds:
        panel = panel.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    return panel


def bargauge_panel(title: str, description: str, unit: str, *, width: int = 8,
                   height: int = 8) -> bargauge.Panel:
    panel = _common(bargauge.Panel(), title, description, unit, width, height)
    return (panel.display_mode(cm.BarGaugeDisplayMode.GRADIENT).orientation(cm.VizOrientation.HORIZONTAL)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))


def table_panel(title: str, description: str, unit: str, *, columns: Sequence[str],
                width: int = 12, height: int = 8, hide: Sequence[str] = ()) -> table.Panel:
    """An instant table: the label `columns` (in order, named as the labels are, so data links can
    use ${__data.fields.<label>}) and then each query's value column, merged on the shared labels."""
    panel = _common(table.Panel(), title, description, unit, width, height)
    order = {name: i for i, name in enumerate(columns)}
    excluded = {"Time": True, "__name__": True, "instance": True, "job": True, **{name: True for name in hide}}
    organize = dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": excluded, "indexByName": order, "renameByName": {},
    })
    return (panel.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
            .with_transformation(organize).filterable(True))


def value_column(panel: table.Panel, ref: str, header: str, unit: str,
                 bands: tuple[str, Sequence[tuple[float, str]]] | None = None) -> table.Panel:
    """Header, unit and optional colour bands of one query's value column ("Value" or "Value #ref")."""
    properties = [dm.DynamicConfigValue(id_val="displayName", value=header),
                  dm.DynamicConfigValue(id_val="unit", value=unit)]
    if bands is not None:
        properties += [
            dm.DynamicConfigValue(id_val="thresholds", value=thresholds(bands[0], *bands[1]).build()),
            dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"}),
        ]
    return panel.override_by_regexp(f"^Value( #{ref})?$", properties)


def sort_desc(column: str) -> cb.TableSortByFieldState:
    return cb.TableSortByFieldState().display_name(column).desc(True)


def column_links(panel: table.Panel, column: str, links: Sequence[DashboardLink]) -> table.Panel:
    """Data links on one column of a table (the column keeps its label name)."""
    return panel.override_by_name(column, [dm.DynamicConfigValue(id_val="links", value=[
        link.build() for link in links])])


def state_timeline_panel(title: str, description: str, unit: str, mappings: dict[str, tuple[str, str]],
                         *, width: int = 12, height: int = 8) -> statetimeline.Panel:
    """`mappings`: value -> (text, colour), e.g. {"1": ("active", "red")}."""
    panel = _common(statetimeline.Panel(), title, description, unit, width, height)
    value_map = dm.ValueMap(options={value: dm.ValueMappingResult(text=text, color=color)
                                     for value, (text, color) in mappings.items()})
    return (panel.mappings([value_map]).show_value(cm.VisibilityMode.NEVER).merge_values(True)
            .row_height(0.8).fill_opacity(80)
            .color_scheme(FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)))


def heatmap_panel(title: str, description: str, unit: str, *, width: int = 24,
                  height: int = 10) -> heatmap.Panel:
    """Rows are series as they come (no bucketing): one row per rank, colour = the value."""
    panel = _common(heatmap.Panel(), title, description, unit, width, height)
    return (panel.calculate(False)
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .fill("dark-orange").scale(hm.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64)
                   .reverse(False))
            .y_axis(heatmap.YAxisConfig().unit("none").axis_placement(cm.AxisPlacement.LEFT))
            .cell_values(heatmap.CellValues().unit(unit))
            .show_legend().show_color_scale(True))


# --- the dashboard ---------------------------------------------------------------------------------
class Board:
    """A dashboard under construction; panels get ids in the order they are added (stable)."""

    def __init__(self, uid: str, title: str, description: str, variables: Sequence, *,
                 docs_url: str = DOCS_URL, time_from: str = "now-1h") -> None:
        self.docs_url = docs_url
        self._next_id = 1
        self.builder = (
            Dashboard(title).uid(uid).description(description).tags([TAG])
            .time(time_from, "now").refresh("30s").timezone("browser").editable()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .links(dashboard_links(docs_url))
            .variables([datasource_variable(), *variables])
        )

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def row(self, title: str) -> Board:
        self.builder = self.builder.with_row(Row(title).id(self._id()))
        return self

    def add(self, *panels) -> Board:
        for panel in panels:
            self.builder = self.builder.with_panel(panel.id(self._id()))
        return self

    def runbooks(self, *alerts: str) -> list[DashboardLink]:
        return runbook_links(alerts, self.docs_url)

    def build(self) -> dm.Dashboard:
        return self.builder.build()
