#!/usr/bin/env python3
"""Checks deploy/, docker/ and the metric names they use. Python 3 standard library only.

  tests/deploy/check_deploy.py [--repo ROOT] [--architecture PATH/ARCHITECTURE.md] [-v]

What it checks (each line of output is PASS, FAIL or SKIP with the reason):
  prometheus   `promtool check config`, `promtool check rules`, `promtool test rules` on
               tests/deploy/rules_test.yml. SKIP when promtool is not installed (Debian package
               `prometheus`, which scripts/bootstrap installs).
  dashboards   every deploy/grafana/dashboards/*.json parses, has a uid, schemaVersion, unique
               panel ids, panels on the 24-column grid, the provisioned datasource uid on every
               panel and target, the instance/device template variables; and the files are what
               deploy/grafana/generate_dashboards.py writes.
  promql       every metric name in a dashboard query or a rule expression is one of ARCHITECTURE.md
               "Metrics" (histograms with _bucket/_sum/_count), a recording rule of rules.yml, or
               `up`; functions are PromQL functions; label names are the ones the architecture
               gives the metric (plus job, instance, le). Every architecture metric is used somewhere.
  server       every metric name is spelled out in server/metrics.cc (or metrics.h); SKIP while that
               file does not exist.
  compose      deploy/docker-compose.yml: `docker compose config` (or `docker-compose config`,
               Debian's 1.29) when a compose CLI is installed; in any case a structural check of
               the file parsed by PyYAML when it happens to be importable (services, profiles,
               GPU reservation, health checks, ports, grace period), or a textual check of the
               same facts without PyYAML. PyYAML is never required.
  k8s          deploy/k8s/*.yaml: the same, structural with PyYAML, textual without.
  docker       the Dockerfiles' required instructions; `bash -n` on the shell scripts.

Exit status 0 when nothing FAILed. The last line reads "N passed, N failed, N skipped".
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

# ARCHITECTURE.md "Metrics", name -> labels. The test also reads the document itself when it can
# find it and fails if the two differ, so that a change there is carried into deploy/ on purpose.
ARCH_METRICS = {
    "attnserve_device_memory_used_bytes": {"device", "uuid"},
    "attnserve_device_memory_total_bytes": {"device", "uuid"},
    "attnserve_device_memory_reserved_bytes": {"device"},
    "attnserve_device_memory_peak_bytes": {"device"},
    "attnserve_device_tokens_total": {"device"},
    "attnserve_device_flops_total": {"device"},
    "attnserve_device_busy_seconds_total": {"device"},
    "attnserve_nccl_bytes_total": {"device", "direction"},
    "attnserve_device_memory_imbalance_ratio": set(),
    "attnserve_requests_total": {"code"},
    "attnserve_request_duration_seconds": set(),
    "attnserve_queue_wait_seconds": set(),
    "attnserve_queue_length": set(),
    "attnserve_inflight_requests": set(),
    "attnserve_received_bytes_total": set(),
    "attnserve_sent_bytes_total": set(),
}
# Metrics the server exports beyond ARCHITECTURE.md (listed in README.md "Metrics"); deploy/ may
# use them too, and check_server still requires each to be spelled out in server/metrics.{cc,h}.
EXTENSION_METRICS = {
    "attnserve_nccl_groups_created_total": set(),
    "attnserve_nccl_communicators_created_total": {"device"},
}
HISTOGRAMS = {"attnserve_request_duration_seconds", "attnserve_queue_wait_seconds"}
TARGET_LABELS = {"job", "instance"}
DATASOURCE_UID = "attnserve-prometheus"
REQUIRED_DASHBOARDS = {"attnserve — GPU memory", "attnserve — throughput"}

PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
    "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg",
    "delta", "deriv", "exp", "floor", "histogram_count", "histogram_fraction",
    "histogram_quantile", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "irate",
    "label_join", "label_replace", "last_over_time", "ln", "log10", "log2", "max_over_time",
    "min_over_time", "minute", "month", "pi", "predict_linear", "present_over_time",
    "quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort",
    "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh",
    "time", "timestamp", "vector", "year",
    # aggregation operators
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile",
}
PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                   "group_right", "bool", "offset", "inf", "nan", "atan2"}
BUILTIN_METRICS = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


class Report:
    def __init__(self, verbose):
        self.verbose = verbose
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def result(self, kind, name, detail=""):
        self.counts[kind] += 1
        line = "%-4s %s" % (kind, name)
        if detail:
            line += ": " + detail
        print(line, flush=True)

    def check(self, name, problems, ok_detail=""):
        if problems:
            self.result("FAIL", name, "\n       ".join([""] + list(problems)))
        else:
            self.result("PASS", name, ok_detail)

    def info(self, text):
        if self.verbose:
            print("     " + text)


# ---------------------------------------------------------------------------------------------
# ARCHITECTURE.md

def find_architecture(repo, explicit):
    candidates = []
    if explicit:
        candidates.append(pathlib.Path(explicit))
    if os.environ.get("ATTNSERVE_ARCHITECTURE_MD"):
        candidates.append(pathlib.Path(os.environ["ATTNSERVE_ARCHITECTURE_MD"]))
    candidates += [repo.parent / "shared" / "ARCHITECTURE.md", repo / "shared" / "ARCHITECTURE.md",
                   repo / "docs" / "ARCHITECTURE.md", repo / "ARCHITECTURE.md"]
    for c in candidates:
        if c.is_file():
            return c
    return None


def parse_architecture_metrics(text):
    m = re.search(r"^## Metrics[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return None
    section = m.group(1)
    out = {}
    for name, labels in re.findall(r"(attnserve_[a-z0-9_]+)(\{[^}]*\})?", section):
        out[name] = {l.strip() for l in labels.strip("{}").split(",") if l.strip()}
    return out


# ---------------------------------------------------------------------------------------------
# A little YAML, without PyYAML: rules.yml's record names and expressions.

def rule_exprs(text):
    """Yields (kind, name, expr) for every rule: kind "record" or "alert"."""
    lines = text.splitlines()
    i = 0
    current = None
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*-\s+(record|alert):\s*(\S+)", line)
        if m:
            current = (m.group(1), m.group(2))
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if m:
            indent = len(m.group(1))
            value = m.group(2).strip()
            if value in ("|", "|-", ">", ">-", "|+", ">+"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                value = " ".join(block)
                yield current[0], current[1], value
                continue
            if value[:1] in "'\"" and value[-1:] == value[:1]:
                value = value[1:-1]
            yield current[0], current[1], value
        i += 1


# ---------------------------------------------------------------------------------------------
# PromQL names

def strip_promql(expr):
    """Returns (expr without strings, label matchers, ranges, grouping label lists),
    matcher label names, grouping label names."""
    matcher_labels, grouping_labels = set(), set()
    e = re.sub(r"\$\{?\w+\}?", "x", expr)                      # Grafana variables
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', e)

    def take_matchers(m):
        for part in m.group(1).split(","):
            mm = re.match(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)", part)
            if mm:
                matcher_labels.add(mm.group(1))
        return " "
    e = re.sub(r"\{([^{}]*)\}", take_matchers, e)
    e = re.sub(r"\[[^\]]*\]", " ", e)

    def take_grouping(m):
        grouping_labels.update(x.strip() for x in m.group(2).split(",") if x.strip())
        return " "
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", take_grouping, e)
    return e, matcher_labels, grouping_labels


def promql_names(expr):
    """(metric names, function names, matcher labels, grouping labels) of one expression."""
    e, matcher_labels, grouping_labels = strip_promql(expr)
    e = re.sub(r"(?<![A-Za-z0-9_:])[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?", " ", e)
    e = re.sub(r"(?<![A-Za-z0-9_:])\.[0-9]+([eE][+-]?[0-9]+)?", " ", e)
    metrics, functions = set(), set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if word.lower() in PROMQL_KEYWORDS:
            continue
        if rest.startswith("("):
            functions.add(word)
        else:
            metrics.add(word)
    return metrics, functions, matcher_labels, grouping_labels


def base_metric(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return name[: -len(suffix)]
    return name


def check_expressions(exprs, arch, recorded):
    """exprs: list of (where, expr). Returns (problems, architecture metrics used)."""
    problems, used = [], set()
    known_labels = set(TARGET_LABELS) | {"le"}
    for labels in arch.values():
        known_labels |= labels
    for where, expr in exprs:
        metrics, functions, mlabels, glabels = promql_names(expr)
        for f in sorted(functions - PROMQL_FUNCTIONS):
            problems.append("%s: unknown PromQL function %s() in %r" % (where, f, expr))
        for name in sorted(metrics):
            b = base_metric(name)
            if b in arch:
                used.add(b)
                if name != b or b not in HISTOGRAMS:
                    pass
                if b in HISTOGRAMS and name == b:
                    problems.append("%s: histogram %s used without _bucket/_sum/_count" % (where, b))
            elif name in recorded or name in BUILTIN_METRICS:
                pass
            elif name.startswith("attnserve_"):
                problems.append("%s: metric %s is not in ARCHITECTURE.md 'Metrics' (nor one of the "
                                "server's documented extensions)" % (where, name))
            elif name.startswith("attnserve:"):
                problems.append("%s: recording rule %s is not defined in rules.yml" % (where, name))
            else:
                problems.append("%s: unknown metric or word %r in %r" % (where, name, expr))
        for label in sorted((mlabels | glabels) - known_labels):
            problems.append("%s: label %r is not a label of any attnserve metric" % (where, label))
        # A label used in a matcher on an attnserve metric must be one that metric has.
        for mm in re.finditer(r"(attnserve_[a-z0-9_]+)\{([^}]*)\}", expr):
            b = base_metric(mm.group(1))
            if b not in arch:
                continue
            allowed = arch[b] | TARGET_LABELS | ({"le"} if b in HISTOGRAMS else set())
            for part in mm.group(2).split(","):
                lm = re.match(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)", part)
                if lm and lm.group(1) not in allowed:
                    problems.append("%s: %s has no label %r (ARCHITECTURE.md gives it %s)"
                                    % (where, b, lm.group(1), sorted(arch[b]) or "none"))
    return problems, used


# ---------------------------------------------------------------------------------------------
# Checks

def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def check_prometheus(rep, repo):
    promtool = shutil.which("promtool")
    if not promtool:
        for name in ("promtool check config", "promtool check rules", "promtool test rules"):
            rep.result("SKIP", name, "promtool not installed (apt-get install prometheus)")
        return
    for name, cmd in [
        ("promtool check config", [promtool, "check", "config", "deploy/prometheus/prometheus.yml"]),
        ("promtool check rules", [promtool, "check", "rules", "deploy/prometheus/rules.yml"]),
        ("promtool test rules", [promtool, "test", "rules", "tests/deploy/rules_test.yml"]),
    ]:
        rc, out = run(cmd, repo)
        rep.check(name, [] if rc == 0 else ["exit %d" % rc] + out.strip().splitlines())


def provisioned_datasource_uid(repo):
    path = repo / "deploy/grafana/provisioning/datasources/prometheus.yml"
    m = re.search(r"^\s*uid:\s*['\"]?([\w-]+)", path.read_text(encoding="utf-8"), re.M)
    return m.group(1) if m else None


def check_dashboards(rep, repo):
    """Returns [(where, expr)] of every query for the PromQL check."""
    exprs = []
    problems = []
    ds_uid = provisioned_datasource_uid(repo)
    if ds_uid != DATASOURCE_UID:
        problems.append("datasource provisioning uid is %r, expected %r" % (ds_uid, DATASOURCE_UID))
    prov = (repo / "deploy/grafana/provisioning/dashboards/dashboards.yml").read_text(encoding="utf-8")
    if not re.search(r"^\s*path:\s*/etc/grafana/dashboards\s*$", prov, re.M):
        problems.append("dashboards.yml: provider path is not /etc/grafana/dashboards")
    files = sorted((repo / "deploy/grafana/dashboards").glob("*.json"))
    if not files:
        problems.append("no dashboards in deploy/grafana/dashboards")
    titles, uids = set(), set()
    for f in files:
        where = f.name
        try:
            d = json.loads(f.read_text(encoding="utf-8"))
        except ValueError as e:
            problems.append("%s: invalid JSON: %s" % (where, e))
            continue
        if not d.get("uid") or len(d["uid"]) > 40:
            problems.append("%s: uid missing or longer than 40 characters" % where)
        if d.get("uid") in uids:
            problems.append("%s: duplicate uid %s" % (where, d.get("uid")))
        uids.add(d.get("uid"))
        titles.add(d.get("title"))
        if not isinstance(d.get("schemaVersion"), int) or not 36 <= d["schemaVersion"] <= 39:
            problems.append("%s: schemaVersion %r (Grafana 10 writes 36..39)" % (where, d.get("schemaVersion")))
        if d.get("id") is not None:
            problems.append("%s: id must be null in provisioned dashboards" % where)
        var_names = {v.get("name") for v in d.get("templating", {}).get("list", [])}
        for needed in ("instance", "device"):
            if needed not in var_names:
                problems.append("%s: template variable $%s missing" % (where, needed))
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") == "query":
                if (v.get("datasource") or {}).get("uid") != DATASOURCE_UID:
                    problems.append("%s: variable %s: datasource uid is not %s" % (where, v.get("name"), DATASOURCE_UID))
                q = v.get("query")
                q = q.get("query") if isinstance(q, dict) else q
                m = re.match(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$", q or "")
                if not m:
                    problems.append("%s: variable %s: query %r is not label_values(selector, label)" % (where, v.get("name"), q))
                else:
                    exprs.append(("%s var $%s" % (where, v.get("name")), m.group(1)))
        ids = set()
        panels = list(d.get("panels", []))
        for p in d.get("panels", []):
            panels.extend(p.get("panels", []))
        for p in panels:
            pw = "%s panel %r" % (where, p.get("title"))
            if p.get("id") in ids:
                problems.append("%s: duplicate panel id %r" % (pw, p.get("id")))
            ids.add(p.get("id"))
            g = p.get("gridPos") or {}
            if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
                problems.append("%s: gridPos incomplete" % pw)
            elif g["x"] + g["w"] > 24 or g["w"] <= 0 or g["h"] <= 0:
                problems.append("%s: gridPos off the 24-column grid" % pw)
            if p.get("type") == "row":
                continue
            if not p.get("title"):
                problems.append("%s: no title" % pw)
            if (p.get("datasource") or {}).get("uid") != DATASOURCE_UID:
                problems.append("%s: datasource uid is not %s" % (pw, DATASOURCE_UID))
            targets = p.get("targets") or []
            if not targets:
                problems.append("%s: no targets" % pw)
            refids = [t.get("refId") for t in targets]
            if len(set(refids)) != len(refids) or not all(refids):
                problems.append("%s: refIds missing or repeated" % pw)
            for t in targets:
                if (t.get("datasource") or {}).get("uid") != DATASOURCE_UID:
                    problems.append("%s: target %s datasource uid is not %s" % (pw, t.get("refId"), DATASOURCE_UID))
                if not t.get("expr"):
                    problems.append("%s: target %s has no expr" % (pw, t.get("refId")))
                else:
                    exprs.append(("%s/%s" % (pw, t.get("refId")), t["expr"]))
            steps = (((p.get("fieldConfig") or {}).get("defaults") or {}).get("thresholds") or {}).get("steps")
            if not steps or steps[0].get("value") is not None:
                problems.append("%s: thresholds must start with a base step (value null)" % pw)
    for t in sorted(REQUIRED_DASHBOARDS - titles):
        problems.append("dashboard %r missing" % t)
    rep.check("dashboards: %d JSON files" % len(files), problems)

    gen = repo / "deploy/grafana/generate_dashboards.py"
    rc, out = run([sys.executable, str(gen), "--check"], repo)
    rep.check("dashboards match generate_dashboards.py", [] if rc == 0 else out.strip().splitlines())
    return exprs


def check_promql(rep, repo, arch, dashboard_exprs):
    text = (repo / "deploy/prometheus/rules.yml").read_text(encoding="utf-8")
    rules = list(rule_exprs(text))
    recorded = {name for kind, name, _ in rules if kind == "record"}
    problems = []
    for name in sorted(recorded):
        if not re.match(r"^attnserve:[a-z0-9_]+:[a-z0-9_]+$", name):
            problems.append("recording rule %s is not named level:metric:operation" % name)
    rule_list = [("rules.yml %s %s" % (k, n), e) for k, n, e in rules]
    p1, used_rules = check_expressions(rule_list, arch, recorded)
    p2, used_dash = check_expressions(dashboard_exprs, arch, recorded)
    problems += p1 + p2
    unused = set(arch) - used_rules - used_dash
    for name in sorted(unused):
        problems.append("%s (ARCHITECTURE.md) is used by no dashboard or rule" % name)
    rep.check("promql: metric names of %d rule and %d dashboard expressions" %
              (len(rule_list), len(dashboard_exprs)), problems,
              "%d architecture metrics, %d recording rules" % (len(arch), len(recorded)))
    return used_rules | used_dash


def check_server(rep, repo, used):
    files = [repo / "server" / n for n in ("metrics.cc", "metrics.h")]
    files = [f for f in files if f.is_file()]
    if not (repo / "server" / "metrics.cc").is_file():
        rep.result("SKIP", "server metric names", "server/metrics.cc does not exist yet")
        return
    text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    problems = ["%s: used by deploy/ but not spelled out in server/metrics.{cc,h}" % n
                for n in sorted(used) if not re.search(r"\b%s\b" % re.escape(n), text)]
    rep.check("server metric names (server/metrics.cc)", problems, "%d names found" % len(used))


def load_yaml_module():
    try:
        import yaml  # noqa: F401  (optional: only used when present)
        return yaml
    except ImportError:
        return None


def compose_cli(repo):
    """Returns the argv prefix of a compose CLI that knows profiles (v2, or v1 >= 1.28), or None."""
    if shutil.which("docker"):
        rc, out = run(["docker", "compose", "version"], repo)
        if rc == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        rc, out = run(["docker-compose", "version", "--short"], repo)
        m = re.match(r"v?(\d+)\.(\d+)", out.strip())
        if rc == 0 and m and (int(m.group(1)), int(m.group(2))) >= (1, 28):
            return ["docker-compose"]
    return None


def duration_seconds(text):
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", str(text)):
        total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[m.group(2)]
        pos += len(m.group(0))
    return total if pos == len(str(text)) and pos else None


DRAIN_DEFAULT_RE = re.compile(r"--drain-timeout=\$\{ATTNSERVE_DRAIN_TIMEOUT_S:-(\d+)\}s")


def check_compose(rep, repo):
    path = repo / "deploy/docker-compose.yml"
    text = path.read_text(encoding="utf-8")
    cli = compose_cli(repo)
    if cli:
        rc, out = run(cli + ["-f", str(path), "--profile", "cpu", "--profile", "gpu", "config", "-q"], repo)
        rep.check("compose: %s config" % " ".join(cli), [] if rc == 0 else out.strip().splitlines())
    else:
        rep.result("SKIP", "compose: docker compose config", "no compose CLI (v2 plugin or docker-compose >= 1.28) installed")

    problems = []
    m = DRAIN_DEFAULT_RE.search(text)
    drain = int(m.group(1)) if m else None
    if drain is None:
        problems.append("attnserve command does not pass --drain-timeout=${ATTNSERVE_DRAIN_TIMEOUT_S:-N}s")
    yaml = load_yaml_module()
    if yaml:
        mode = "structural (PyYAML)"
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            rep.check("compose: parse", ["YAML error: %s" % e])
            return
        services = doc.get("services") or {}
        for s in ("attnserve-gpu", "attnserve-cpu", "prometheus", "grafana"):
            if s not in services:
                problems.append("service %s missing" % s)
        gpu, cpu = services.get("attnserve-gpu", {}), services.get("attnserve-cpu", {})
        if gpu.get("profiles") != ["gpu"]:
            problems.append("attnserve-gpu: profiles must be [gpu]")
        if cpu.get("profiles") != ["cpu"]:
            problems.append("attnserve-cpu: profiles must be [cpu]")
        devs = (((gpu.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
        if not any(d.get("driver") == "nvidia" and d.get("count") == "all" and d.get("capabilities") == ["gpu"]
                   for d in devs):
            problems.append("attnserve-gpu: needs deploy.resources.reservations.devices "
                            "{driver: nvidia, count: all, capabilities: [gpu]}")
        env = gpu.get("environment") or {}
        if isinstance(env, list):
            env = dict(e.split("=", 1) for e in env)
        if str(env.get("NCCL_NVLS_ENABLE")) != "0":
            problems.append("attnserve-gpu: environment NCCL_NVLS_ENABLE must be 0")
        for name, svc in (("attnserve-gpu", gpu), ("attnserve-cpu", cpu)):
            hc = (svc.get("healthcheck") or {}).get("test") or []
            if hc[1:] != ["attnctl", "health", "--server", "127.0.0.1:50051"]:
                problems.append("%s: healthcheck must run attnctl health --server 127.0.0.1:50051" % name)
            if not svc.get("restart"):
                problems.append("%s: no restart policy" % name)
            grace = duration_seconds(svc.get("stop_grace_period", ""))
            if grace is None or drain is None or not drain < grace <= drain + 30:
                problems.append("%s: stop_grace_period %r must exceed --drain-timeout %ss by a little"
                                % (name, svc.get("stop_grace_period"), drain))
            ports = [str(p) for p in svc.get("ports") or []]
            for port in ("50051:50051", "9464:9464"):
                if port not in ports:
                    problems.append("%s: port %s not published" % (name, port))
            aliases = (((svc.get("networks") or {}).get("default") or {}).get("aliases")) or []
            if "attnserve" not in aliases:
                problems.append("%s: network alias 'attnserve' (the scrape target) missing" % name)
            df = (svc.get("build") or {}).get("dockerfile")
            if not df or not (path.parent / (svc["build"].get("context", ".")) / df).is_file():
                problems.append("%s: build.dockerfile %r not found" % (name, df))
        for name, port in (("prometheus", "9090:9090"), ("grafana", "3000:3000")):
            svc = services.get(name, {})
            if port not in [str(p) for p in svc.get("ports") or []]:
                problems.append("%s: port %s not published" % (name, port))
            if not svc.get("healthcheck") or not svc.get("restart"):
                problems.append("%s: healthcheck and restart policy required" % name)
            for vol in svc.get("volumes") or []:
                src = str(vol).split(":", 1)[0]
                if src.startswith(".") and not (path.parent / src).exists():
                    problems.append("%s: volume source %s does not exist" % (name, src))
    else:
        mode = "textual (no PyYAML)"
        if "\t" in text:
            problems.append("tab characters in YAML")
        for needle in ["attnserve-gpu:", "attnserve-cpu:", "prometheus:", "grafana:",
                       'profiles: ["gpu"]', 'profiles: ["cpu"]', "driver: nvidia", "count: all",
                       "capabilities: [gpu]", 'NCCL_NVLS_ENABLE: "0"',
                       'test: ["CMD", "attnctl", "health", "--server", "127.0.0.1:50051"]',
                       '"50051:50051"', '"9464:9464"', '"9090:9090"', '"3000:3000"',
                       "stop_grace_period:", "restart:", "./prometheus:/etc/prometheus",
                       "./grafana/provisioning:/etc/grafana/provisioning",
                       "./grafana/dashboards:/etc/grafana/dashboards"]:
            if needle not in text:
                problems.append("missing %r" % needle)
        g = re.search(r"stop_grace_period:\s*(\S+)", text)
        grace = duration_seconds(g.group(1)) if g else None
        if grace is None or drain is None or not drain < grace:
            problems.append("stop_grace_period must exceed the --drain-timeout default")
    rep.check("compose: %s" % mode, problems)


def check_k8s(rep, repo):
    files = sorted((repo / "deploy/k8s").glob("*.yaml"))
    problems = []
    if not files:
        problems.append("no manifests in deploy/k8s")
    yaml = load_yaml_module()
    text = "\n".join(f.read_text(encoding="utf-8") for f in files)
    if yaml:
        mode = "structural (PyYAML)"
        docs = []
        for f in files:
            try:
                docs += [d for d in yaml.safe_load_all(f.read_text(encoding="utf-8")) if d]
            except yaml.YAMLError as e:
                problems.append("%s: %s" % (f.name, e))
        kinds = {d.get("kind"): d for d in docs}
        dep, svc = kinds.get("Deployment"), kinds.get("Service")
        if not dep or not svc:
            problems.append("need a Deployment and a Service")
        else:
            pod = dep["spec"]["template"]
            ann = pod["metadata"].get("annotations") or {}
            if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != "9464":
                problems.append("pod template lacks prometheus.io/scrape + port 9464 annotations")
            spec = pod["spec"]
            c = spec["containers"][0]
            args = " ".join(c.get("args") or [])
            m = re.search(r"--drain-timeout=(\d+)s", args)
            tgp = spec.get("terminationGracePeriodSeconds")
            if not m or not isinstance(tgp, int) or not int(m.group(1)) < tgp:
                problems.append("terminationGracePeriodSeconds must exceed --drain-timeout")
            lim = (c.get("resources") or {}).get("limits") or {}
            if "nvidia.com/gpu" not in lim:
                problems.append("container has no nvidia.com/gpu limit")
            for probe in ("readinessProbe", "livenessProbe"):
                g = (c.get(probe) or {}).get("grpc") or {}
                if g.get("port") != 50051:
                    problems.append("%s must be a grpc probe on 50051" % probe)
            env = {e["name"]: e.get("value") for e in c.get("env") or []}
            if env.get("NCCL_NVLS_ENABLE") != "0":
                problems.append("NCCL_NVLS_ENABLE=0 missing from the container env")
            if dep["spec"]["selector"]["matchLabels"].items() - pod["metadata"]["labels"].items():
                problems.append("Deployment selector does not match the pod labels")
            if svc["spec"]["selector"].items() - pod["metadata"]["labels"].items():
                problems.append("Service selector does not match the pod labels")
            ports = {p["port"] for p in svc["spec"]["ports"]}
            if not {50051, 9464} <= ports:
                problems.append("Service must expose 50051 and 9464")
    else:
        mode = "textual (no PyYAML)"
        for needle in ["kind: Deployment", "kind: Service", "nvidia.com/gpu:", "terminationGracePeriodSeconds:",
                       "readinessProbe:", "livenessProbe:", "grpc:", "port: 50051",
                       'prometheus.io/scrape: "true"', 'prometheus.io/port: "9464"']:
            if needle not in text:
                problems.append("missing %r" % needle)
    rep.check("k8s: %s" % mode, problems)


def check_docker(rep, repo):
    problems = []
    needles = {
        "docker/Dockerfile.cpu": ["ARG BASE_IMAGE=attnserve/debian:bookworm", "AS build",
                                  "scripts/bootstrap", "-DATTNSERVE_ENABLE_CUDA=OFF",
                                  "ARG CPU_ARCH=x86-64-v3", "-DATTNSERVE_CPU_ARCH=${CPU_ARCH}",
                                  "USER 10001", "EXPOSE 50051 9464",
                                  'CMD ["attnctl", "health", "--server", "127.0.0.1:50051"]',
                                  'ENTRYPOINT ["attnserve", "--backend", "cpu"]'],
        "docker/Dockerfile.gpu": ["ARG BASE_IMAGE=", "ARG BUILD_IMAGE=", "AS build", "scripts/bootstrap",
                                  "-DATTNSERVE_ENABLE_CUDA=ON", "NCCL_NVLS_ENABLE=0", "USER 10001",
                                  "EXPOSE 50051 9464",
                                  'CMD ["attnctl", "health", "--server", "127.0.0.1:50051"]',
                                  'ENTRYPOINT ["attnserve", "--backend", "auto"]'],
        "docker/Dockerfile.prometheus": ["ARG BASE_IMAGE=attnserve/debian:bookworm", "prometheus", "USER prometheus"],
    }
    for rel, items in needles.items():
        f = repo / rel
        if not f.is_file():
            problems.append("%s missing" % rel)
            continue
        text = f.read_text(encoding="utf-8")
        for n in items:
            if n not in text:
                problems.append("%s: missing %r" % (rel, n))
        # Every COPY source must exist in the repository (the build context is the repo root).
        for m in re.finditer(r"^COPY\s+(?!--from)(.+)$", text, re.M):
            parts = m.group(1).split()
            for src in parts[:-1]:
                if src.startswith("--"):
                    continue
                if not (repo / src).exists() and src not in ("server", "client", "bench", "tests"):
                    problems.append("%s: COPY source %s does not exist" % (rel, src))
        if re.search(r"^#\s*syntax=", text, re.M):
            problems.append("%s: a # syntax= line makes BuildKit pull a frontend image from a registry" % rel)
    rep.check("docker: Dockerfiles", problems)

    problems = []
    for rel in ("scripts/build-base-image", "docker/runtime-deps.sh", "tests/deploy/docker_smoke.sh"):
        f = repo / rel
        if not f.is_file():
            problems.append("%s missing" % rel)
            continue
        if not os.access(f, os.X_OK):
            problems.append("%s is not executable" % rel)
        rc, out = run(["bash", "-n", str(f)], repo)
        if rc:
            problems.append("%s: bash -n: %s" % (rel, out.strip()))
    rep.check("docker: shell scripts (bash -n)", problems)


def main():
    ap = argparse.ArgumentParser(description="attnserve deploy/ checks")
    ap.add_argument("--repo", type=pathlib.Path, default=HERE.parent.parent)
    ap.add_argument("--architecture", help="path of ARCHITECTURE.md (found beside the repo otherwise)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    repo = args.repo.resolve()
    rep = Report(args.verbose)

    arch = ARCH_METRICS
    doc = find_architecture(repo, args.architecture)
    if doc:
        parsed = parse_architecture_metrics(doc.read_text(encoding="utf-8"))
        if parsed is None:
            rep.check("ARCHITECTURE.md metrics", ["%s has no '## Metrics' section" % doc])
        else:
            problems = []
            for n in sorted(set(parsed) | set(arch)):
                if parsed.get(n) != arch.get(n):
                    problems.append("%s: ARCHITECTURE.md says %s, this test %s"
                                    % (n, sorted(parsed[n]) if n in parsed else "absent",
                                       sorted(arch[n]) if n in arch else "absent"))
            rep.check("ARCHITECTURE.md metrics match this test's list", problems, str(doc))
    else:
        rep.result("SKIP", "ARCHITECTURE.md metrics", "ARCHITECTURE.md not found; using the built-in list")

    check_prometheus(rep, repo)
    exprs = check_dashboards(rep, repo)
    used = check_promql(rep, repo, {**arch, **EXTENSION_METRICS}, exprs)
    check_server(rep, repo, used)
    check_compose(rep, repo)
    check_k8s(rep, repo)
    check_docker(rep, repo)

    c = rep.counts
    print("deploy: %d passed, %d failed, %d skipped" % (c["PASS"], c["FAIL"], c["SKIP"]))
    return 1 if c["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
