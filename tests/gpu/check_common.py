"""What the GPU machine's Python checks share: running laoyao (its log kept under $OUT), one line
per check as it is decided, and the table printed last with the exit status."""
import os
import subprocess


class Checks:
    def __init__(self, laoyao, out):
        self.laoyao, self.out = laoyao, out
        self.results = []
        os.makedirs(out, exist_ok=True)

    def check(self, name, ok, detail):
        self.results.append((name, "PASS" if ok else "FAIL", detail))
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)

    def run(self, args, device=None, log=None):
        """laoyao ARGS (LAOYAO_DEVICE=device when given); its output, kept in $OUT/log; RuntimeError
        with the output's tail when it fails."""
        env = dict(os.environ)
        if device:
            env["LAOYAO_DEVICE"] = device
        p = subprocess.run([self.laoyao] + args, capture_output=True, text=True, env=env)
        if log:
            with open(os.path.join(self.out, log), "w") as f:
                f.write(p.stdout + p.stderr)
        if p.returncode != 0:
            raise RuntimeError(f"laoyao {' '.join(args[:3])} ... exit {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")
        return p.stdout + p.stderr

    def finish(self):
        """The table of every check; the exit status: 1 when one failed."""
        print("\n| check | verdict | detail |\n|---|---|---|")
        for name, verdict, detail in self.results:
            print(f"| {name} | {verdict} | {detail} |")
        return 1 if any(v != "PASS" for _, v, _ in self.results) else 0
