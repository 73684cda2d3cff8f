#!/usr/bin/env bash
# A single-node SLURM on this machine (Debian 12, root, no systemd) to rehearse `--launcher slurm` on, and what
# tests/test_local_slurm.py starts: munged, a private MariaDB, slurmdbd, slurmctld and slurmd on localhost, on
# non-default ports, with a fresh state directory. Installs slurm-wlm, munge, slurmdbd and mariadb-server if missing.
#   slurm/local-cluster.sh start [STATE_DIR]   then: export SLURM_CONF=STATE_DIR/slurm.conf; sinfo; sbatch ...
#   slurm/local-cluster.sh stop [STATE_DIR]
set -euo pipefail
ACTION=${1:-start}
S=$(realpath -m "${2:-/tmp/blindheads-slurm}")
HOST=$(hostname -s)

stop() {
  for name in slurmd slurmctld slurmdbd mariadbd munged; do
    if [ -f "$S/$name.pid" ]; then kill "$(cat "$S/$name.pid")" 2>/dev/null || true; fi
  done
  sleep 1
}

if [ "$ACTION" = stop ]; then stop; exit 0; fi
if [ "$ACTION" != start ]; then echo "local-cluster.sh: unknown action $ACTION; valid: start, stop" >&2; exit 2; fi
if [ "$(id -u)" != 0 ]; then echo "local-cluster.sh: needs root (every daemon runs as root)" >&2; exit 1; fi
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v munged >/dev/null \
    || ! command -v mariadbd >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server >/dev/null
fi
[ -d "$S" ] && stop
rm -rf "$S" && mkdir -p "$S/ctld" "$S/d" "$S/mysql"

dd if=/dev/urandom of="$S/munge.key" bs=1024 count=1 status=none && chmod 400 "$S/munge.key"
munged --force --key-file="$S/munge.key" --socket="$S/munge.sock" --pid-file="$S/munged.pid" \
  --log-file="$S/munged.log" --seed-file="$S/munge.seed"

mariadb-install-db --datadir="$S/mysql" --user=root --auth-root-authentication-method=socket >"$S/mariadb-install.log" 2>&1
mariadbd --no-defaults --datadir="$S/mysql" --socket="$S/mysql.sock" --port=13306 --bind-address=127.0.0.1 \
  --pid-file="$S/mariadbd.pid" --user=root --log-error="$S/mariadb.log" &
for _ in $(seq 100); do [ -S "$S/mysql.sock" ] && break; sleep 0.1; done
mariadb --socket="$S/mysql.sock" -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

AUTH="AuthType=auth/munge
AuthInfo=socket=$S/munge.sock,cred_expire=10"
cat >"$S/slurmdbd.conf" <<CONF
$AUTH
DbdHost=localhost
DbdPort=16819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=13306
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$S/slurmdbd.pid
LogFile=$S/slurmdbd.log
CONF
chmod 600 "$S/slurmdbd.conf"
cat >"$S/slurm.conf" <<CONF
ClusterName=blindheads
SlurmctldHost=$HOST
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
$AUTH
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/d
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=16819
AccountingStoragePass=$S/munge.sock
JobRequeue=1
KillWait=30
NodeName=$HOST CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$S/slurm.conf
slurmdbd  # reads slurmdbd.conf beside SLURM_CONF
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/16819) 2>/dev/null && break; sleep 0.1; done
slurmctld -f "$S/slurm.conf"
slurmd -f "$S/slurm.conf"
for _ in $(seq 200); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.1; done
if ! sinfo -h -o %T 2>/dev/null | grep -q idle; then
  echo "local-cluster.sh: the node did not come up; see $S/*.log" >&2; exit 1
fi
echo "SLURM_CONF=$S/slurm.conf"
