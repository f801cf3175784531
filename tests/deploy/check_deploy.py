#!/usr/bin/env python3
"""Checks deploy/, docker/ and the metric names they use. Python 3 standard library only.

  tests/deploy/check_deploy.py [--repo ROOT] [--design PATH/DESIGN.md] [-v]

What it checks (each line of output is PASS, FAIL or SKIP with the reason):
  prometheus   `promtool check config`, `promtool check rules`, `promtool test rules` on
               tests/deploy/rules_test.yml. SKIP when promtool is not installed (Debian package
               `prometheus`, which scripts/bootstrap installs).
  dashboards   every deploy/grafana/dashboards/*.json parses, has a uid, schemaVersion, unique
               panel ids, panels on the 24-column grid, the provisioned datasource uid on every
               panel and target, the instance/device template variables; and the files are what
               deploy/grafana/generate_dashboards.py writes.
  design       docs/DESIGN.md "Metrics" lists the metric names and labels this test knows
               (DESIGN_METRICS in deploy_checks/metrics.py), no more and no fewer.
  promql       every metric name in a dashboard query or a rule expression is one of DESIGN.md
               "Metrics" (histograms with _bucket/_sum/_count), a recording rule of rules.yml, or
               `up`; functions are PromQL functions; label names are the ones DESIGN.md gives the
               metric (plus job, instance, le). Every documented metric is used somewhere.
  server       every metric name is spelled out in server/metrics.cc (or metrics.h); SKIP while that
               file does not exist.
  compose      deploy/docker-compose.yml: `docker compose config` (or `docker-compose config`,
               Debian's 1.29) when a compose CLI is installed; in any case a structural check of
               the file parsed by PyYAML when it happens to be importable (services, profiles,
               GPU reservation, health checks, ports, grace period), or a textual check of the
               same facts without PyYAML. PyYAML is never required.
  k8s          deploy/k8s/*.yaml: the same, structural with PyYAML, textual without.
  docker       the Dockerfiles' required instructions; `bash -n` on the shell scripts.
  docs         every document the project's documents (and deploy/, tests/deploy, server/) name
               is in the repository, and every docs/DESIGN.md section they name is a heading
               there: the documentation stands alone.

The checks live in deploy_checks/ (one module per area); this file runs them.
Exit status 0 when nothing FAILed. The last line reads "N passed, N failed, N skipped".
"""

import argparse
import pathlib
import sys

from deploy_checks.containers import check_compose, check_docker, check_k8s
from deploy_checks.docs import check_docs
from deploy_checks.metrics import DESIGN_METRICS, check_design_metrics
from deploy_checks.observability import (check_dashboards, check_prometheus, check_promql,
                                         check_server)
from deploy_checks.report import Report

HERE = pathlib.Path(__file__).resolve().parent


def main():
    ap = argparse.ArgumentParser(description="attnserve deploy/ checks")
    ap.add_argument("--repo", type=pathlib.Path, default=HERE.parent.parent)
    ap.add_argument("--design", "--architecture", dest="design",
                    help="the design document with the 'Metrics' section (default: docs/DESIGN.md "
                         "of --repo; --architecture is the older name of this flag)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    repo = args.repo.resolve()
    rep = Report(args.verbose)

    check_design_metrics(rep, repo, args.design)
    check_prometheus(rep, repo)
    exprs = check_dashboards(rep, repo)
    used = check_promql(rep, repo, DESIGN_METRICS, exprs)
    check_server(rep, repo, used)
    check_compose(rep, repo)
    check_k8s(rep, repo)
    check_docker(rep, repo)
    check_docs(rep, repo)

    c = rep.counts
    print("deploy: %d passed, %d failed, %d skipped" % (c["PASS"], c["FAIL"], c["SKIP"]))
    return 1 if c["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
