"""The project's documents stand alone: every document they point to is in the repository, and
every section of docs/DESIGN.md they name ("DESIGN.md "Metrics"") is a heading there."""

import re
import subprocess

# Where the references are read: the documents, and the files of deploy/ and tests/deploy that
# send readers to them. Recorded runs (bench/results/) keep the names of their time.
SOURCES = re.compile(r"(\.md$|^deploy/.*\.(ya?ml|py)$|^tests/deploy/.*\.(py|ya?ml|sh)$|"
                     r"^server/.*\.(cc|h)$)")
EXCLUDED = ("bench/results/",)
# A document name: upper-case stem (README.md, DESIGN.md, NOTES.md), optionally with a path.
DOC_REF = re.compile(r"(?<![\w$./{}-])((?:[\w.-]+/)*[A-Z][A-Z0-9_-]*\.md)\b")
SECTION_REF = re.compile(r"DESIGN\.md,? \"([^\"]+)\"")


def tracked(repo):
    out = subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def check_docs(rep, repo):
    files = tracked(repo)
    names = {f.rsplit("/", 1)[-1] for f in files}
    paths = set(files)
    design = (repo / "docs/DESIGN.md").read_text(encoding="utf-8")
    headings = [h.strip() for h in re.findall(r"^#{2,4} (.*)$", design, re.M)]
    problems, refs = [], 0
    for f in files:
        if not SOURCES.search(f) or f.startswith(EXCLUDED) or not (repo / f).is_file():
            continue
        text = (repo / f).read_text(encoding="utf-8", errors="replace")
        here = f.rsplit("/", 1)[0] if "/" in f else ""
        for n, line in enumerate(text.splitlines(), 1):
            for ref in DOC_REF.findall(line):
                if any(part.isupper() for part in ref.split("/")[:-1]):
                    continue  # a placeholder in a usage line: PATH/DESIGN.md
                refs += 1
                ok = ("/" not in ref and ref in names) or ref in paths or \
                    (here and "%s/%s" % (here, ref) in paths)
                if not ok:
                    problems.append("%s:%d: %s is not in the repository" % (f, n, ref))
            for section in SECTION_REF.findall(line):
                refs += 1
                if not any(h.startswith(section) for h in headings):
                    problems.append("%s:%d: docs/DESIGN.md has no section \"%s\""
                                    % (f, n, section))
    rep.check("docs: referenced documents and DESIGN.md sections exist", problems,
              "%d references" % refs)
