"""Prometheus (promtool), the Grafana dashboards, the PromQL of both, and the server's metric
names."""

import json
import re
import shutil
import sys

from deploy_checks.metrics import check_expressions, rule_exprs
from deploy_checks.report import run

DATASOURCE_UID = "attnserve-prometheus"
REQUIRED_DASHBOARDS = {"attnserve — GPU memory", "attnserve — throughput"}


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
        problems.append("%s (DESIGN.md) is used by no dashboard or rule" % name)
    rep.check("promql: metric names of %d rule and %d dashboard expressions" %
              (len(rule_list), len(dashboard_exprs)), problems,
              "%d documented metrics, %d recording rules" % (len(arch), len(recorded)))
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
