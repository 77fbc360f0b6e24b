#!/bin/sh
# Install what the Slurm harness needs on a Debian (bookworm) machine, if it is missing.
# Idempotent: a machine that has everything returns at once. Run as root (CI does).
#   slurm-wlm                slurmctld, slurmd, scontrol, squeue, sacctmgr (22.05 on bookworm)
#   munge                    Slurm's authentication
#   slurmrestd               the REST daemon; slurm-wlm-jwt-plugin adds its token auth (auth/jwt)
#   slurmdbd, mariadb-server accounting: accounts and QoS
set -eu

need=""
for pair in slurmctld:slurm-wlm slurmd:slurm-wlm scontrol:slurm-client squeue:slurm-client \
            sacctmgr:slurm-client munged:munge slurmrestd:slurmrestd slurmdbd:slurmdbd \
            mariadbd:mariadb-server mariadb-install-db:mariadb-server; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need="$need ${pair#*:}"
done
# slurmrestd's token auth is a plugin package of its own on Debian
ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1 || need="$need slurm-wlm-jwt-plugin"
if [ -z "$need" ]; then
    echo "slurm harness: everything installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm harness: missing packages:$need; run this script as root" >&2
    exit 1
fi
start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
# Packages must not start their own daemons: the harness runs private ones on loopback.
policy=/usr/sbin/policy-rc.d
had_policy=0; [ -e "$policy" ] && had_policy=1
if [ "$had_policy" -eq 0 ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; fi
trap 'if [ "$had_policy" -eq 0 ]; then rm -f "$policy"; fi' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurm-wlm slurm-client slurmd slurmctld munge \
    slurmrestd slurm-wlm-jwt-plugin slurmdbd mariadb-server >/dev/null
echo "slurm harness: installed$need in $(( $(date +%s) - start )) s"
