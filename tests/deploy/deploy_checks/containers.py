"""deploy/docker-compose.yml, deploy/k8s and docker/: structural checks with PyYAML when it
happens to be installed, textual ones otherwise (PyYAML is never required)."""

import os
import re
import shutil

from deploy_checks.report import run


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
                # A kubelet gRPC probe on 50051, or (with TLS, which that probe cannot speak)
                # attnctl health against localhost:50051 in the container.
                g = (c.get(probe) or {}).get("grpc") or {}
                cmd = ((c.get(probe) or {}).get("exec") or {}).get("command") or []
                if g.get("port") != 50051 and not (
                        cmd[:2] == ["attnctl", "health"] and "localhost:50051" in cmd):
                    problems.append("%s must be a grpc probe on 50051 or attnctl health" % probe)
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
                       "readinessProbe:", "livenessProbe:", "port: 50051",
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
        # The attnserve images build the repo's CMake project: every folder the top-level
        # CMakeLists.txt adds must be copied into the build stage.
        if rel in ("docker/Dockerfile.cpu", "docker/Dockerfile.gpu"):
            top = (repo / "CMakeLists.txt").read_text(encoding="utf-8")
            copied = set()
            for m in re.finditer(r"^COPY\s+(?!--from)(.+)$", text, re.M):
                copied.update(m.group(1).split()[:-1])
            for sub in re.findall(r"^\s*add_subdirectory\((\w+)\)", top, re.M):
                if sub not in copied:
                    problems.append("%s: the build stage does not COPY %s/ (CMakeLists.txt adds it)"
                                    % (rel, sub))
        if re.search(r"^#\s*syntax=", text, re.M):
            problems.append("%s: a # syntax= line makes BuildKit pull a frontend image from a registry" % rel)
    rep.check("docker: Dockerfiles", problems)

    problems = []
    for rel in ("scripts/build-base-image", "docker/runtime-deps.sh", "tests/deploy/docker_smoke.sh",
                "tests/deploy/secure_compose_smoke.sh"):
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
