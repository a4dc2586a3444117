#!/usr/bin/env python3
"""The lost-work benchmark (docs/lost-work.md): N agents, each its own session
(COHERENT_SESSION), on a few shared files for R rounds, with a seeded mix of

  rmw      read a whole file, think (a delay), write it whole with one more line (the
           lost-update pattern of an editor or a model's Write tool);
  append   `echo TOKEN >> FILE`;
  sed      `sed -i '$a TOKEN' FILE`;
  create   `echo TOKEN > new-AGENT-I.txt` (a blind create);
  handoff  read FILE, `coherent transfer --to NEXT FILE` and, with p=0.3, one more write
           from the pre-handoff view a little later (a late write).

Every write carries a unique token. Lost = tokens whose write returned success but are
missing from their file at the end. The agent model does what the deny text says: on
`stale_view` it reads the file again and redoes its change; on `fenced` it waits for the
successor (`coherent wait --until completed`) and, if that times out, withdraws. A
successor learns of a handoff from a note (outside the workspace, the same on a plain
directory) and takes it: reads the file and writes it.

The same seeded schedule runs on a plain directory and on a mount of each binary given
(`--bin LABEL=DIR`, DIR holding coherent-mount and coherent). Each lost token is
attributed to the write that erased it:

  late_write       a late giver's write (from its pre-handoff view) after the token was
                   committed;
  stale_overwrite  another write from a view older than the token, opened after the token
                   was committed (what the stale guard refuses);
  race_in_handle   an overwrite whose handle was already open (or whose tool had already
                   read) when the token was committed: a race inside one handle's life;
  torn_read        an overwrite whose read came after the token's write had returned and
                   still did not hold the token: it read while another writer was rewriting
                   the file in place (truncated, not yet written back), a race inside that
                   writer's handle's life;
  unexplained      none of these.

Output: a table on stdout and, with --json FILE, every run's numbers.

  scripts/bench-lostwork.py --agents 2,4,8 --seeds 5 \
      --bin before=/tmp/base-bin --bin after=target/release --json /tmp/lostwork.json
"""
import argparse
import errno
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

KINDS = [("rmw", 0.42), ("append", 0.24), ("sed", 0.10), ("create", 0.08), ("handoff", 0.16)]
FILES = 4
LATE_P = 0.3
MAX_TRIES = 6
WAIT_SECS = 3
# ---------------------------------------------------------------- the schedule


def plan(seed, agents, rounds):
    """Per agent: its list of ops (the same on every target)."""
    rng = random.Random(seed * 1000 + agents)
    files = [f"shared-{k}.txt" for k in range(FILES)]
    plans = []
    for a in range(agents):
        ops = []
        for r in range(rounds):
            u, acc, kind = rng.random(), 0.0, "rmw"
            for k, w in KINDS:
                acc += w
                if u < acc:
                    kind = k
                    break
            if kind == "handoff" and agents < 2:
                kind = "rmw"
            op = {
                "kind": kind,
                "file": rng.choice(files),
                "token": f"T{seed}-{agents}-a{a}-r{r}",
                "think": rng.uniform(0.0, 0.05),
                "delay": rng.uniform(0.01, 0.12),
            }
            if kind == "handoff":
                op["to"] = (a + 1 + rng.randrange(agents - 1)) % agents
                op["late"] = rng.random() < LATE_P
                op["late_delay"] = rng.uniform(0.05, 0.5)
                op["late_token"] = op["token"] + "-late"
            if kind == "create":
                op["file"] = f"new-a{a}-r{r}.txt"
            ops.append(op)
        plans.append(ops)
    return files, plans


# ---------------------------------------------------------------- one agent (a worker)


class Agent:
    def __init__(self, cfg):
        self.root, self.me, self.cli = cfg["root"], cfg["agent"], cfg["cli"]
        self.mounted, self.notes = cfg["mounted"], cfg["notes"]
        self.log = []  # one entry per token write
        self.events = []  # transfers, waits, withdrawals
        self.read_errors = []

    def now(self):
        return time.monotonic()

    def path(self, f):
        return os.path.join(self.root, f)

    def reason(self):
        """Why the last write was refused, from the deny text at .coherent/why."""
        if not self.mounted:
            return "eacces"
        try:
            with open(self.path(".coherent/why")) as fh:
                text = fh.read()
        except OSError:
            return "eacces"
        if "can no longer write it" in text:
            return "fenced"
        if "changed it since" in text:
            return "stale_view"
        return "other"

    def read(self, f):
        with open(self.path(f)) as fh:
            return fh.read()

    def read_again(self, f):
        """A read that failed is tried again (an agent never writes from a read that
        failed as if the file were empty); every failure is counted by errno."""
        for _ in range(5):
            try:
                return self.read(f)
            except OSError as err:
                self.read_errors.append(errno.errorcode.get(err.errno, str(err.errno)))
                time.sleep(0.01)
        return None

    def coherent(self, *args, timeout=30):
        p = subprocess.run([self.cli, "--json", *args], cwd=self.root, timeout=timeout,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out = json.loads(p.stdout) if p.stdout.strip() else {}
        except ValueError:
            out = {}
        return p.returncode, out

    def fenced(self, f):
        """The deny text's ways out: wait for the successor, else withdraw."""
        if not self.mounted:
            return
        rc, _ = self.coherent("wait", f, "--until", "completed", "--timeout", str(WAIT_SECS),
                              timeout=WAIT_SECS + 10)
        if rc == 0:
            self.events.append({"event": "waited", "file": f})
            time.sleep(0.05)  # the successor's commit moves the version after its acquire
            return
        rc, _ = self.coherent("withdraw", f)
        self.events.append({"event": "withdrew" if rc == 0 else "withdraw_refused", "file": f})

    def write_whole(self, f, token, base_text=None, delay=0.0, kind="rmw", read_at=None):
        """Read-modify-write of a whole file (base_text: write from that view, read at
        read_at, instead of reading: the late giver's first try)."""
        e = {"token": token, "file": f, "kind": kind, "ok": False, "tries": 0, "refusals": [],
             "agent": self.me, "read_at": read_at}
        base = base_text
        while e["tries"] < MAX_TRIES:
            e["tries"] += 1
            if base is None:
                e["read_at"] = self.now()
                base = self.read_again(f)
                if base is None:
                    e["error"] = "read failed"
                    break
                time.sleep(delay)
            e["write_at"] = self.now()
            try:
                with open(self.path(f), "w") as fh:
                    fh.write(base + token + "\n")
                e["ok"], e["end"], e["base"] = True, self.now(), base
                break
            except PermissionError:
                why = self.reason()
                e["refusals"].append(why)
                if why == "fenced":
                    self.fenced(f)
                base, delay = None, delay / 2  # read again, redo the change
        self.log.append(e)

    def shell(self, f, token, kind, cmd):
        e = {"token": token, "file": f, "kind": kind, "ok": False, "tries": 0, "refusals": [],
             "agent": self.me}
        while e["tries"] < MAX_TRIES:
            e["tries"] += 1
            e["read_at"] = e["write_at"] = self.now()
            p = subprocess.run(["sh", "-c", cmd], cwd=self.root, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
            if p.returncode == 0:
                e["ok"], e["end"] = True, self.now()
                break
            if "ermission denied" not in p.stderr:
                e["error"] = p.stderr.strip()[:200]
                break
            why = self.reason()
            e["refusals"].append(why)
            if why == "fenced":
                self.fenced(f)
            elif why == "stale_view":
                self.read_again(f)  # read it again: the next try is from the current view
        self.log.append(e)

    def take_handoffs(self):
        d = os.path.join(self.notes, str(self.me))
        for n in sorted(os.listdir(d)):
            if n.startswith("."):
                continue  # a note still being written
            with open(os.path.join(d, n)) as fh:
                note = json.load(fh)
            os.unlink(os.path.join(d, n))
            # the successor takes it: reads the file, writes its part
            self.write_whole(note["file"], note["token"], delay=0.02, kind="successor")

    def handoff(self, op):
        f = op["file"]
        view_at = self.now()
        view = self.read_again(f)
        if view is None:
            return
        ok = True
        if self.mounted:
            rc, out = self.coherent("transfer", "--to", f"agent-{op['to']}", f)
            ok = rc == 0
            self.events.append({"event": "transfer", "file": f, "ok": ok, "agent": self.me,
                                "reason": out.get("reason") if not ok else None})
        if not ok:
            return
        note = {"file": f, "token": op["token"] + "-succ"}
        d = os.path.join(self.notes, str(op["to"]))
        tmp = os.path.join(d, f".{op['token']}")
        with open(tmp, "w") as fh:
            json.dump(note, fh)
        os.rename(tmp, os.path.join(d, op["token"]))
        if op.get("late"):
            time.sleep(op["late_delay"])
            self.write_whole(f, op["late_token"], base_text=view, delay=op["delay"], kind="late",
                             read_at=view_at)

    def run(self, ops):
        for op in ops:
            self.take_handoffs()
            time.sleep(op["think"])
            f, t = op["file"], op["token"]
            k = op["kind"]
            if k == "rmw":
                self.write_whole(f, t, delay=op["delay"])
            elif k == "append":
                self.shell(f, t, "append", f"echo {t} >> {f}")
            elif k == "sed":
                self.shell(f, t, "sed", f"sed -i '$a {t}' {f}")
            elif k == "create":
                self.shell(f, t, "create", f"echo {t} > {f}")
            elif k == "handoff":
                self.handoff(op)
        # a last look for handoffs that arrived after this agent's last op
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            self.take_handoffs()
            time.sleep(0.05)


def worker(cfg_path, out_path):
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    a = Agent(cfg)
    a.run(cfg["ops"])
    with open(out_path, "w") as fh:
        json.dump({"log": a.log, "events": a.events, "read_errors": a.read_errors}, fh)


# ---------------------------------------------------------------- one run


def mount(bindir, back, mnt, state, stale, extra):
    args = [os.path.join(bindir, "coherent-mount"), back, mnt, "--state-dir", state] + extra
    if stale:
        args += ["--stale", stale]
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(state, "..", "mount.log"), "w"))
    for _ in range(1000):
        if os.path.ismount(mnt):
            return p
        if p.poll() is not None:
            break
        time.sleep(0.01)
    raise SystemExit(f"mount failed: see {state}/../mount.log")


def run_one(target, bindir, seed, agents, rounds, stale, keep, extra):
    base = tempfile.mkdtemp(prefix="coh-lostwork-")
    back, mnt, state, notes = (os.path.join(base, x) for x in ("b", "m", "s", "notes"))
    for d in (back, mnt, state, notes):
        os.mkdir(d)
    for a in range(agents):
        os.mkdir(os.path.join(notes, str(a)))
    files, plans = plan(seed, agents, rounds)
    for f in files:
        with open(os.path.join(back, f), "w") as fh:
            fh.write(f"# {f}\n")
    proc = None
    root = back
    cli = shutil.which("true")
    if bindir:
        proc = mount(bindir, back, mnt, state, stale, extra)
        root, cli = mnt, os.path.join(bindir, "coherent")
    t0 = time.monotonic()
    workers = []
    for a in range(agents):
        cfg = {"root": root, "agent": a, "cli": cli, "mounted": bool(bindir), "notes": notes,
               "ops": plans[a]}
        cp, op = os.path.join(base, f"cfg{a}.json"), os.path.join(base, f"out{a}.json")
        with open(cp, "w") as fh:
            json.dump(cfg, fh)
        env = dict(os.environ, COHERENT_SESSION=f"agent-{a}")
        workers.append((subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                          "--worker", cp, op], env=env, cwd=root), op))
    logs, events, read_errors = [], [], []
    for w, op in workers:
        if w.wait() != 0:
            raise SystemExit(f"a worker failed ({target}, seed {seed})")
        with open(op) as fh:
            out = json.load(fh)
        logs += out["log"]
        events += out["events"]
        read_errors += out["read_errors"]
    wall = time.monotonic() - t0
    final = {}
    for e in logs:
        if e["file"] not in final:
            try:
                with open(os.path.join(root, e["file"])) as fh:
                    final[e["file"]] = fh.read()
            except OSError:
                final[e["file"]] = ""
    log_events = []
    if proc:
        try:
            with open(os.path.join(mnt, ".coherent", "events")) as fh:
                log_events = [json.loads(x) for x in fh if x.strip()]
        except OSError:
            pass
        proc.terminate()
        proc.wait(timeout=30)
    res = score(logs, events, final, log_events)
    res["read_errors"] = {k: read_errors.count(k) for k in sorted(set(read_errors))}
    res.update(target=target, seed=seed, agents=agents, rounds=rounds, wall_s=round(wall, 2))
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    else:
        res["dir"] = base
    return res


def score(logs, events, final, log_events):
    ok = [e for e in logs if e["ok"]]
    lost = [e for e in ok if e["token"] not in final.get(e["file"], "").split("\n")]
    overwrites = [e for e in ok if e["kind"] in ("rmw", "successor", "late", "sed")]
    causes, details = {}, []
    for t in lost:
        cause, by = "unexplained", None
        for w in sorted(overwrites, key=lambda w: w["end"]):
            if w["file"] != t["file"] or w is t:
                continue
            if w["kind"] == "sed":
                # sed reads the file and renames its new copy onto it somewhere inside its
                # run: a token written in that window is lost (into the copy sed read too
                # early, or into the inode sed's rename replaced while the token's handle
                # was open on it)
                if w["read_at"] < t["end"] and w["end"] > t["write_at"]:
                    cause, by = "race_in_handle", w
                    break
                continue
            # an overwrite that ended before the token's write began cannot have erased it
            if w["end"] <= t["write_at"] or t["token"] in w["base"].split("\n"):
                continue
            if w["read_at"] > t["end"]:
                # the writer read after the token's write had returned, and its read did
                # not hold the token: it read while another writer had the file truncated
                cause = "torn_read"
            elif w["write_at"] < t["end"]:
                cause = "race_in_handle"
            else:
                cause = "late_write" if w["kind"] == "late" else "stale_overwrite"
            by = w
            break
        causes[cause] = causes.get(cause, 0) + 1
        details.append({"token": t["token"], "kind": t["kind"], "cause": cause,
                        "by": by and by["token"], "by_kind": by and by["kind"]})
    refusals, retries, false_ref = {}, 0, 0
    givers = {(ev["agent"], ev["file"]) for ev in events
              if ev["event"] == "transfer" and ev["ok"]}
    for e in logs:
        retries += max(0, e["tries"] - 1)
        for r in e["refusals"]:
            refusals[r] = refusals.get(r, 0) + 1
        # An append or a blind create refused `stale_view`: never right, but for a session
        # that handed the file on (the late-giver rule refuses its appends too).
        if e["kind"] in ("append", "create") and "stale_view" in e["refusals"]:
            if (e["agent"], e["file"]) not in givers:
                false_ref += 1
    gave_up = sum(1 for e in logs if not e["ok"])
    ev_count = {}
    for ev in log_events:
        k = ev.get("event")
        if k == "denied":
            k = f"denied:{ev.get('reason')}"
        elif k == "stale_write" and ev.get("op") == "write":
            k = "stale_write:commit"
        if k in ("denied:stale_view", "denied:fenced", "stale_write", "stale_write:commit",
                 "transfer", "completed", "withdraw"):
            ev_count[k] = ev_count.get(k, 0) + 1
    transfers = [ev for ev in events if ev["event"] == "transfer"]
    return {
        "writes_ok": len(ok),
        "lost": len(lost),
        "lost_pct": round(100.0 * len(lost) / max(1, len(ok)), 2),
        "lost_by_cause": causes,
        "refusals": refusals,
        "retries": retries,
        "gave_up": gave_up,
        "false_refusals": false_ref,
        "transfers_ok": sum(1 for x in transfers if x["ok"]),
        "transfers_refused": sum(1 for x in transfers if not x["ok"]),
        "waits": sum(1 for x in events if x["event"] == "waited"),
        "withdrawals": sum(1 for x in events if x["event"] == "withdrew"),
        "log_events": ev_count,
        "lost_tokens": details,
    }


# ---------------------------------------------------------------- the table


def table(results):
    rows = {}
    for r in results:
        rows.setdefault((r["target"], r["agents"]), []).append(r)
    causes = ["late_write", "stale_overwrite", "race_in_handle", "torn_read", "unexplained"]
    head = (["target", "agents", "runs", "writes ok", "lost", "lost %"] + causes +
            ["stale_view", "fenced", "retries", "gave up", "false ref", "wall s"])
    out = [head]
    for (target, agents), rs in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
        s = lambda k: sum(r[k] for r in rs)
        c = lambda k: sum(r["lost_by_cause"].get(k, 0) for r in rs)
        f = lambda k: sum(r["refusals"].get(k, 0) for r in rs)
        ok, lost = s("writes_ok"), s("lost")
        walls = sorted(r["wall_s"] for r in rs)
        out.append([target, str(agents), str(len(rs)), str(ok), str(lost),
                    f"{100.0 * lost / max(1, ok):.2f}"] + [str(c(k)) for k in causes] +
                   [str(f("stale_view")), str(f("fenced")), str(s("retries")), str(s("gave_up")),
                    str(s("false_refusals")), f"{walls[len(walls) // 2]:.1f}"])
    w = [max(len(r[i]) for r in out) for i in range(len(head))]
    lines = []
    for i, r in enumerate(out):
        lines.append("| " + " | ".join(x.rjust(w[j]) for j, x in enumerate(r)) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (x + 2) for x in w) + "|")
    return "\n".join(lines)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", default="2,4,8")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bin", action="append", default=[],
                    help="LABEL=DIR with coherent-mount and coherent (repeatable)")
    ap.add_argument("--stale", help="--stale of every mount (default: the binary's default)")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain directory")
    ap.add_argument("--mount-arg", action="append", default=[],
                    help="one more argument for every coherent-mount (repeatable)")
    ap.add_argument("--json", help="write every run's numbers here")
    ap.add_argument("--keep", action="store_true", help="keep each run's directories")
    a = ap.parse_args()
    if os.geteuid() != 0 and a.bin:
        print("note: mounting needs /dev/fuse access (root in the test rig)", file=sys.stderr)
    targets = [] if a.no_plain else [("plain", None)]
    for b in a.bin:
        label, _, d = b.partition("=")
        targets.append((label, os.path.abspath(d or label)))
    results = []
    for agents in [int(x) for x in a.agents.split(",")]:
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            for label, d in targets:
                r = run_one(label, d, seed, agents, a.rounds, a.stale, a.keep, a.mount_arg)
                results.append(r)
                print(f"{label:>8} agents={agents} seed={seed}: {r['lost']}/{r['writes_ok']} lost "
                      f"{r['lost_by_cause']} refusals {r['refusals']} {r['wall_s']}s",
                      file=sys.stderr)
    print(table(results))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
