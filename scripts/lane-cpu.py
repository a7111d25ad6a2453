#!/usr/bin/python3
# lane-cpu.py - the CPU time each lane of test/run-all.sh uses, measured
# from outside the run (docs/testing-lanes.md, "Where the CPU goes").
#
# Usage, as root, beside a run of the test command:
#     scripts/lane-cpu.py TAG &   ...   kill -TERM $!
# It writes /tmp/lane-cpu-TAG.txt every 30 s and when it is stopped: one
# line per lane, "laneNN SECONDS" (the host's lanes, in run-all.sh's
# order) or "in-laneNN SECONDS" (the lanes of the chroot's own run).
#
# How: every 0.3 s, each process whose standard output is a lane's log
# (lockfence-run.*/laneNN.log, lockfence-inner.*/laneNN.log) is moved into
# a cpuacct cgroup (v1) of that lane.  Processes forked afterwards stay in
# their parent's cgroup whatever they do with their output (servers, pg_ctl
# daemons), and cpuacct.usage also counts processes that have exited, so a
# lane's figure is all its work from its first 0.3 s on; what a lane's
# first process forked before it was seen is moved with it.  Needs the cgroup
# v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct (this machine's); the
# cgroups are left behind, empty, under lf-TAG.
import os
import re
import signal
import sys
import time

tag = sys.argv[1] if len(sys.argv) > 1 else str(os.getpid())
root = '/sys/fs/cgroup/cpuacct/lf-' + tag
out = '/tmp/lane-cpu-%s.txt' % tag
lane_log = re.compile(r'/(lockfence-run|lockfence-inner)\.[^/]+/(lane\d\d)\.log$')
groups = {}


def report(*stopped):
    with open(out, 'w') as f:
        for name in sorted(groups):
            try:
                with open(groups[name] + '/cpuacct.usage') as u:
                    ns = int(u.read())
            except OSError:
                continue
            f.write('%s %.1f\n' % (name, ns / 1e9))
    if stopped:
        sys.exit(0)


def in_group(pid, name):
    with open('/proc/%s/cgroup' % pid) as f:
        for line in f:
            if ':cpuacct' in line or ',cpuacct' in line:
                return line.rstrip().endswith('/lf-%s/%s' % (tag, name))
    return False


def lane_of(pid):
    """The lane whose log is pid's standard output, or None."""
    try:
        m = lane_log.search(os.readlink('/proc/%s/fd/1' % pid))
    except OSError:
        return None
    if m is None:
        return None
    return ('in-' if m.group(1) == 'lockfence-inner' else '') + m.group(2)


def children_map(pids):
    kids = {}
    for pid in pids:
        try:
            with open('/proc/%s/stat' % pid) as f:
                ppid = f.read().rsplit(')', 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        kids.setdefault(ppid, []).append(pid)
    return kids


def move(pid, name):
    with open(groups[name] + '/cgroup.procs', 'w') as f:
        f.write(pid)


# The cgroups of an earlier run with the same tag still hold its counts.
if os.path.isdir(root):
    sys.exit('lane-cpu: %s exists (an earlier run with tag %s): choose another tag' % (root, tag))
os.makedirs(root)
signal.signal(signal.SIGTERM, report)
last = 0.0
while True:
    pids = [p for p in os.listdir('/proc') if p.isdigit()]
    kids = None
    for pid in pids:
        name = lane_of(pid)
        if name is None:
            continue
        try:
            if name not in groups:
                groups[name] = root + '/' + name
                os.makedirs(groups[name], exist_ok=True)
            if in_group(pid, name):
                continue
            move(pid, name)
            # Seen for the first time: the processes it forked before this
            # scan (a lane that starts prove at once, whose output goes
            # through tee) did not inherit the group; move them too, but
            # not those writing another lane's log (the chroot's lanes).
            kids = kids if kids is not None else children_map(pids)
            todo = list(kids.get(pid, []))
            while todo:
                k = todo.pop()
                if lane_of(k) not in (None, name):
                    continue
                try:
                    move(k, name)
                except OSError:
                    continue
                todo.extend(kids.get(k, []))
        except OSError:
            pass                # the process ended meanwhile
    if time.time() - last > 30:
        report()
        last = time.time()
    time.sleep(0.3)
