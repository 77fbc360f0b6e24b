#!/bin/sh
# enter_cgroup.sh PROCS_FILE... -- COMMAND [ARG...]
#
# Write this shell's own pid into each cgroup.procs file given, then exec COMMAND: the command
# keeps the pid, so it starts inside those cgroups, and every process it forks inherits them.
# Exit 125 (before running anything) when a cgroup cannot be entered.
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    echo "$$" >"$1" || { echo "enter_cgroup.sh: cannot enter $1" >&2; exit 125; }
    shift
done
[ "$#" -gt 1 ] || { echo "usage: enter_cgroup.sh PROCS_FILE... -- COMMAND [ARG...]" >&2; exit 125; }
shift
exec "$@"
