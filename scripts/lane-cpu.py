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
# lane's figure is all its work from its first 0.3 s on.  Needs the cgroup
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


os.makedirs(root, exist_ok=True)
signal.signal(signal.SIGTERM, report)
last = 0.0
while True:
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            m = lane_log.search(os.readlink('/proc/%s/fd/1' % pid))
            if m is None:
                continue
            name = ('in-' if m.group(1) == 'lockfence-inner' else '') + m.group(2)
            if name not in groups:
                groups[name] = root + '/' + name
                os.makedirs(groups[name], exist_ok=True)
            if not in_group(pid, name):
                with open(groups[name] + '/cgroup.procs', 'w') as f:
                    f.write(pid)
        except OSError:
            pass                # the process ended meanwhile
    if time.time() - last > 30:
        report()
        last = time.time()
    time.sleep(0.3)
