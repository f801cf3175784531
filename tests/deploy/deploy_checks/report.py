"""Output of the deploy checks: one PASS, FAIL or SKIP line per check, and the counts."""

import subprocess


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


def run(cmd, cwd):
    """(exit status, stdout and stderr together) of a command."""
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout
