#!/usr/bin/env python3
"""Writes the attnserve Grafana dashboards (deploy/grafana/dashboards/*.json).

The JSON files are checked in (Grafana provisioning reads them as they are); this script is their
source, so that panels stay uniform and every query uses the metric names of docs/DESIGN.md
"Metrics". Python 3 standard library only.

  deploy/grafana/generate_dashboards.py           rewrite the JSON files
  deploy/grafana/generate_dashboards.py --check   exit 1 if a JSON file differs from what it would write
                                                  (tests/deploy runs this)

Dashboards target Grafana 10 (schemaVersion 38) and reference the Prometheus datasource by the
uid that deploy/grafana/provisioning/datasources/prometheus.yml gives it.
"""

import argparse
import json
import pathlib
import sys

DATASOURCE_UID = "attnserve-prometheus"
DS = {"type": "prometheus", "uid": DATASOURCE_UID}
SCHEMA_VERSION = 38
OUT_DIR = pathlib.Path(__file__).resolve().parent / "dashboards"

# Label selectors driven by the template variables. `instance` is single-valued (one server per
# view, so that {{device}} legends are unambiguous); `device` is multi-valued with "All".
SEL_I = 'instance=~"$instance"'
SEL_ID = 'instance=~"$instance", device=~"$device"'


class Layout:
    """Places panels left to right on Grafana's 24-column grid."""

    def __init__(self):
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def place(self, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def new_id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title):
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        panel = {
            "id": self.new_id(),
            "type": "row",
            "title": title,
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            "panels": [],
        }
        self.y += 1
        return panel


def target(expr, legend, ref):
    return {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": ref,
    }


def thresholds(*steps):
    """steps: (color, value) pairs; the first value is None (the base colour)."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


GREEN_ONLY = thresholds(("green", None))


def targets(queries):
    return [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(queries)]


def timeseries(layout, title, queries, unit, w=12, h=8, description="", th=None, th_style="off",
               minimum=None, maximum=None, stack=False):
    defaults = {
        "color": {"mode": "palette-classic"},
        "custom": {
            "axisBorderShow": False,
            "axisCenteredZero": False,
            "axisPlacement": "auto",
            "drawStyle": "line",
            "fillOpacity": 10,
            "gradientMode": "none",
            "lineInterpolation": "linear",
            "lineWidth": 1,
            "pointSize": 4,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "normal" if stack else "none"},
            "thresholdsStyle": {"mode": th_style},
        },
        "mappings": [],
        "thresholds": th or GREEN_ONLY,
        "unit": unit,
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "id": layout.new_id(),
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table",
                       "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets(queries),
    }


def stat(layout, title, queries, unit, th, w=6, h=8, description=""):
    return {
        "id": layout.new_id(),
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {
            "defaults": {"color": {"mode": "thresholds"}, "mappings": [], "thresholds": th,
                         "unit": unit, "decimals": 1},
            "overrides": [],
        },
        "options": {
            "colorMode": "background",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "auto",
        },
        "targets": targets(queries),
    }


def gauge(layout, title, queries, unit, th, w=12, h=8, description="", minimum=0, maximum=1):
    return {
        "id": layout.new_id(),
        "type": "gauge",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": layout.place(w, h),
        "fieldConfig": {
            "defaults": {"color": {"mode": "thresholds"}, "mappings": [], "thresholds": th,
                         "unit": unit, "min": minimum, "max": maximum, "decimals": 1},
            "overrides": [],
        },
        "options": {
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showThresholdLabels": False,
            "showThresholdMarkers": True,
        },
        "targets": targets(queries),
    }


def variables(device_metric):
    instance = {
        "name": "instance",
        "label": "Instance",
        "type": "query",
        "datasource": DS,
        "definition": 'label_values(up{job="attnserve"}, instance)',
        "query": {"query": 'label_values(up{job="attnserve"}, instance)',
                  "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "sort": 1,
        "multi": False,
        "includeAll": False,
        "current": {},
        "options": [],
        "hide": 0,
        "regex": "",
    }
    device_q = 'label_values(%s{instance=~"$instance"}, device)' % device_metric
    device = {
        "name": "device",
        "label": "Device",
        "type": "query",
        "datasource": DS,
        "definition": device_q,
        "query": {"query": device_q, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
        "regex": "",
    }
    return {"list": [instance, device]}


def dashboard(uid, title, description, panels, device_metric, other_uid, other_title):
    return {
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "description": description,
        "editable": False,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{
            "asDropdown": False,
            "icon": "dashboard",
            "includeVars": True,
            "keepTime": True,
            "tags": [],
            "targetBlank": False,
            "title": other_title,
            "type": "link",
            "url": "/d/%s" % other_uid,
        }],
        "panels": panels,
        "refresh": "10s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["attnserve"],
        "templating": variables(device_metric),
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


def memory_dashboard():
    L = Layout()
    imb_th = thresholds(("green", None), ("yellow", 0.1), ("red", 0.2))
    used_th = thresholds(("green", None), ("yellow", 0.8), ("red", 0.9))
    p = []
    p.append(L.row("Balance across devices"))
    p.append(stat(
        L, "Memory imbalance (10m, working devices)",
        [('max(attnserve:device_memory_imbalance:ratio_avg10m{%s})' % SEL_I, "imbalance")],
        "percentunit", imb_th, w=6,
        description="(max - min) / max of the 10-minute average memory in use of the devices that "
                    "shared the work (busy at least 1% of the window); idle devices do not count. "
                    "Alert AttnserveGpuMemoryImbalance fires above 0.2 for 5m when the fullest of "
                    "them holds over 10% of its memory."))
    p.append(timeseries(
        L, "Memory imbalance ratio",
        [('max(attnserve:device_memory_imbalance:ratio_avg10m{%s})' % SEL_I,
          "10m averages, working devices (alerted)"),
         ('max(attnserve_device_memory_imbalance_ratio{%s})' % SEL_I, "snapshot, all devices")],
        "percentunit", w=9, th=imb_th, th_style="line+area", minimum=0, maximum=1,
        description="The alerted ratio (recording rule over 10-minute averages of the devices that "
                    "shared the work) and the server's snapshot over all devices, which reads 1 "
                    "whenever one device is idle next to a busy one; red above 0.2."))
    p.append(timeseries(
        L, "Max - min memory in use",
        [('max(attnserve_device_memory_used_bytes{%s}) - min(attnserve_device_memory_used_bytes{%s})'
          % (SEL_I, SEL_I), "gap")],
        "bytes", w=9, minimum=0,
        description="Bytes between the most and the least loaded device of the server."))
    p.append(L.row("Per device"))
    p.append(gauge(
        L, "Used / total",
        [('max by (device) (attnserve_device_memory_used_bytes{%s}) / '
          'max by (device) (attnserve_device_memory_total_bytes{%s})' % (SEL_ID, SEL_ID),
          "{{device}}")],
        "percentunit", used_th, w=24, h=6,
        description="Device memory in use over capacity, one gauge per device. Alert "
                    "AttnserveDeviceMemoryHigh fires above 0.9 for 5m."))
    for metric, title, desc in [
        ("attnserve_device_memory_used_bytes", "Memory used",
         "Device memory in use (caching allocator + cudaMemGetInfo)."),
        ("attnserve_device_memory_reserved_bytes", "Memory reserved",
         "Bytes the caching allocator holds from the driver (in use + cached)."),
        ("attnserve_device_memory_peak_bytes", "Memory peak",
         "Highest bytes in use since the server started."),
        ("attnserve_device_memory_total_bytes", "Memory total",
         "Device capacity."),
    ]:
        p.append(timeseries(L, title, [("max by (device) (%s{%s})" % (metric, SEL_ID), "{{device}}")],
                            "bytes", w=12, minimum=0, description=desc))
    return dashboard(
        "attnserve-gpu-memory", "attnserve — GPU memory",
        "Per-device memory of one attnserve server: used, reserved, peak, total; imbalance.",
        p, "attnserve_device_memory_total_bytes",
        "attnserve-throughput", "attnserve — throughput")


def throughput_dashboard():
    L = Layout()
    busy_th = thresholds(("green", None), ("yellow", 0.8), ("red", 0.95))
    p = []
    p.append(L.row("Devices"))
    p.append(timeseries(
        L, "Tokens/s per device",
        [('sum by (device) (rate(attnserve_device_tokens_total{%s}[1m]))' % SEL_ID, "{{device}}")],
        "suffix: tok/s", minimum=0,
        description="Query tokens of attention work done per second, per device."))
    p.append(timeseries(
        L, "TFLOP/s per device",
        [('sum by (device) (rate(attnserve_device_flops_total{%s}[1m])) / 1e12' % SEL_ID,
          "{{device}}")],
        "suffix: TFLOP/s", minimum=0,
        description="Attention FLOPs (4*B*Hq*N*N_kept*D) per second, per device."))
    p.append(timeseries(
        L, "Busy fraction",
        [('clamp_max(sum by (device) (rate(attnserve_device_busy_seconds_total{%s}[1m])), 1)'
          % SEL_ID, "{{device}}")],
        "percentunit", th=busy_th, minimum=0, maximum=1,
        description="Fraction of wall time each device's worker spent running work."))
    p.append(timeseries(
        L, "NCCL bytes/s by direction",
        [('sum by (device, direction) (rate(attnserve_nccl_bytes_total{%s}[1m]))' % SEL_ID,
          "{{device}} {{direction}}")],
        "Bps", minimum=0,
        description="Ring attention K/V traffic between devices."))
    p.append(timeseries(
        L, "NCCL groups / communicators created",
        [('sum(increase(attnserve_nccl_groups_created_total{%s}[5m]))' % SEL_I, "groups"),
         ('sum by (device) (increase(attnserve_nccl_communicators_created_total{%s}[5m]))'
          % SEL_ID, "{{device}} communicators")],
        "short", minimum=0,
        description="GPU rings reuse cached NCCL communicators: after the first ring over a set of "
                    "GPUs these stay at 0. Steady increases mean groups are being rebuilt after "
                    "failures (aborts, timeouts, cancels)."))
    p.append(L.row("Requests"))
    p.append(timeseries(
        L, "Requests/s by code",
        [('sum by (code) (rate(attnserve_requests_total{%s}[1m]))' % SEL_I, "{{code}}")],
        "reqps", minimum=0, stack=True,
        description="Finished requests per second by gRPC status code."))
    p.append(timeseries(
        L, "Request duration p50 / p90 / p99",
        [('histogram_quantile(%s, sum by (le) (rate(attnserve_request_duration_seconds_bucket{%s}[1m])))'
          % (q, SEL_I), name) for q, name in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"))],
        "s", minimum=0,
        description="From the attnserve_request_duration_seconds histogram (whole request, "
                    "first message to last)."))
    p.append(timeseries(
        L, "Queue length and in-flight",
        [("sum(attnserve_queue_length{%s})" % SEL_I, "queued"),
         ("sum(attnserve_inflight_requests{%s})" % SEL_I, "in flight")],
        "short", w=8, minimum=0,
        description="Requests waiting for admission, and requests admitted and not finished."))
    p.append(timeseries(
        L, "Queue wait p50 / p99",
        [('histogram_quantile(%s, sum by (le) (rate(attnserve_queue_wait_seconds_bucket{%s}[1m])))'
          % (q, SEL_I), name) for q, name in (("0.5", "p50"), ("0.99", "p99"))],
        "s", w=8, minimum=0,
        th=thresholds(("green", None), ("red", 10)), th_style="line",
        description="Time from arrival to admission. Alert AttnserveQueueSaturated fires when p99 "
                    "stays above 10 s for 5m."))
    p.append(timeseries(
        L, "Received / sent bytes/s",
        [("sum(rate(attnserve_received_bytes_total{%s}[1m]))" % SEL_I, "received"),
         ("sum(rate(attnserve_sent_bytes_total{%s}[1m]))" % SEL_I, "sent")],
        "Bps", w=8, minimum=0,
        description="Tensor bytes streamed in (Q, K, V) and out (O, LSE)."))
    L.row("Data path")
    p.append(timeseries(
        L, "Time per stage (mean)",
        [("sum by (stage) (rate(attnserve_request_stage_seconds_sum{%s}[1m])) / "
          "sum by (stage) (rate(attnserve_request_stage_seconds_count{%s}[1m]))" % (SEL_I, SEL_I),
          "{{stage}}")],
        "s", minimum=0,
        description="Mean seconds per successful call in each stage: receive, queue, compute "
                    "(copy and kernel are parts of compute), send. A kernel line far below the "
                    "others means the data path, not the GPU, sets the pace."))
    p.append(timeseries(
        L, "Host <-> device copies",
        [("sum by (device, direction) (rate(attnserve_device_copy_bytes_total{%s}[1m]))" % SEL_ID,
          "{{device}} {{direction}}"),
         ("sum by (device) (rate(attnserve_device_pageable_copy_bytes_total{%s}[1m]))" % SEL_ID,
          "{{device}} pageable")],
        "Bps", minimum=0,
        description="Bytes/s copied between host memory and each device; the pageable part "
                    "(slow copies from unpinned memory) is expected to stay at 0."))
    p.append(timeseries(
        L, "Page-locked host memory",
        [("sum by (state) (attnserve_host_page_locked_bytes{%s})" % SEL_I, "{{state}}"),
         ("max(attnserve_host_page_locked_cap_bytes{%s})" % SEL_I, "cap")],
        "bytes", minimum=0,
        description="The page-locked pool behind request buffers: in use, cached for reuse, "
                    "caller regions registered for copies, and the cap (--pinned-host-cap-bytes)."))
    p.append(timeseries(
        L, "Pageable fallback bytes/s",
        [("sum(rate(attnserve_host_pageable_fallback_bytes_total{%s}[1m]))" % SEL_I,
          "fallback")],
        "Bps", minimum=0,
        description="Buffers handed out pageable because the page-locked pool was at its cap: "
                    "raise --pinned-host-cap-bytes if this is not 0."))
    p.append(timeseries(
        L, "Shared-memory regions",
        [("sum by (kind) (attnserve_regions{%s})" % SEL_I, "{{kind}} regions"),
         ("sum by (kind) (attnserve_region_bytes{%s})" % SEL_I, "{{kind}} bytes")],
        "short", minimum=0,
        description="Caller regions mapped (RegisterRegion: system shared memory, CUDA IPC) and "
                    "their bytes; at --max-regions new registrations are refused."))
    p.append(timeseries(
        L, "Contexts",
        [("sum(attnserve_contexts{%s})" % SEL_I, "contexts"),
         ("sum by (device) (attnserve_context_bytes{%s})" % SEL_I, "{{device}} K/V bytes")],
        "short", minimum=0,
        description="Contexts kept between calls (CreateContext) and the K/V bytes they hold on "
                    "each device; at --context-memory-bytes new rows are refused."))
    return dashboard(
        "attnserve-throughput", "attnserve — throughput",
        "Per-device tokens/s, TFLOP/s, busy fraction and NCCL traffic; request rate, latency, "
        "queue and bytes of one attnserve server.",
        p, "attnserve_device_tokens_total",
        "attnserve-gpu-memory", "attnserve — GPU memory")


DASHBOARDS = {
    "attnserve-gpu-memory.json": memory_dashboard,
    "attnserve-throughput.json": throughput_dashboard,
}


def render(build):
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare instead of writing; exit 1 when a file is missing or differs")
    ap.add_argument("--out-dir", type=pathlib.Path, default=OUT_DIR)
    args = ap.parse_args()
    stale = []
    for name, build in DASHBOARDS.items():
        path = args.out_dir / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print("wrote", path)
    if stale:
        print("stale dashboards (run deploy/grafana/generate_dashboards.py): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
