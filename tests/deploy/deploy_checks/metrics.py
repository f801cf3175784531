"""The metric names and labels of docs/DESIGN.md "Metrics", and the PromQL they are used in.

A little PromQL and YAML parsing, enough to pull metric, function and label names out of the
dashboards' queries and rules.yml's expressions; Python 3 standard library only.
"""

import pathlib
import re

# docs/DESIGN.md "Metrics", name -> labels. check_design_metrics reads the document itself and
# fails if the two differ, so that a change there is carried into deploy/ on purpose.
DESIGN_METRICS = {
    "attnserve_device_memory_used_bytes": {"device", "uuid"},
    "attnserve_device_memory_total_bytes": {"device", "uuid"},
    "attnserve_device_memory_reserved_bytes": {"device"},
    "attnserve_device_memory_peak_bytes": {"device"},
    "attnserve_device_tokens_total": {"device"},
    "attnserve_device_flops_total": {"device"},
    "attnserve_device_busy_seconds_total": {"device"},
    "attnserve_nccl_bytes_total": {"device", "direction"},
    "attnserve_nccl_groups_created_total": set(),
    "attnserve_nccl_communicators_created_total": {"device"},
    "attnserve_device_memory_imbalance_ratio": set(),
    "attnserve_requests_total": {"code"},
    "attnserve_request_duration_seconds": set(),
    "attnserve_queue_wait_seconds": set(),
    "attnserve_queue_length": set(),
    "attnserve_inflight_requests": set(),
    "attnserve_received_bytes_total": set(),
    "attnserve_sent_bytes_total": set(),
    "attnserve_request_stage_seconds": {"stage"},
    "attnserve_device_copy_bytes_total": {"device", "direction"},
    "attnserve_device_pageable_copy_bytes_total": {"device"},
    "attnserve_host_page_locked_bytes": {"state"},
    "attnserve_host_page_locked_cap_bytes": set(),
    "attnserve_host_pageable_fallback_bytes_total": set(),
    "attnserve_regions": {"kind"},
    "attnserve_region_bytes": {"kind"},
    "attnserve_contexts": set(),
    "attnserve_context_bytes": {"device"},
}
HISTOGRAMS = {"attnserve_request_duration_seconds", "attnserve_queue_wait_seconds",
              "attnserve_request_stage_seconds"}
TARGET_LABELS = {"job", "instance"}
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


# ---------------------------------------------------------------------------------------------
# docs/DESIGN.md "Metrics"

def find_design_doc(repo, explicit):
    """docs/DESIGN.md of the repository, or the document given with --design."""
    return pathlib.Path(explicit) if explicit else repo / "docs" / "DESIGN.md"


def parse_design_metrics(text):
    """name -> labels of every attnserve_* name in the "Metrics" section (a level-2 or level-3
    heading "Metrics ..."), written as attnserve_name or attnserve_name{label, label}; None when
    there is no such section."""
    m = re.search(r"^(##|###) Metrics\b[^\n]*\n(.*?)(?=^#{1,3} |\Z)", text, re.S | re.M)
    if not m:
        return None
    section = m.group(2)
    out = {}
    for name, labels in re.findall(r"(attnserve_[a-z0-9_]+)(\{[^}]*\})?", section):
        out[name] = {l.strip() for l in labels.strip("{}").split(",") if l.strip()}
    return out


def check_design_metrics(rep, repo, explicit):
    """The design document's "Metrics" section lists exactly DESIGN_METRICS."""
    doc = find_design_doc(repo, explicit)
    if not doc.is_file():
        rep.check("DESIGN.md metrics", ["%s does not exist" % doc])
        return
    parsed = parse_design_metrics(doc.read_text(encoding="utf-8"))
    if parsed is None:
        rep.check("DESIGN.md metrics", ["%s has no 'Metrics' section" % doc])
        return
    problems = []
    for n in sorted(set(parsed) | set(DESIGN_METRICS)):
        if parsed.get(n) != DESIGN_METRICS.get(n):
            problems.append("%s: DESIGN.md says %s, this test %s"
                            % (n, sorted(parsed[n]) if n in parsed else "absent",
                               sorted(DESIGN_METRICS[n]) if n in DESIGN_METRICS else "absent"))
    rep.check("DESIGN.md metrics match this test's list", problems, str(doc))


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
    """exprs: list of (where, expr); arch: the documented metrics, name -> labels. Returns
    (problems, documented metrics used)."""
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
                problems.append("%s: metric %s is not in DESIGN.md 'Metrics'" % (where, name))
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
                    problems.append("%s: %s has no label %r (DESIGN.md gives it %s)"
                                    % (where, b, lm.group(1), sorted(arch[b]) or "none"))
    return problems, used


