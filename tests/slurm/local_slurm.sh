#!/usr/bin/env bash
# A one-node SLURM on this machine for the SLURM tests: munge and slurmctld/slurmd for localhost,
# with their configuration, state and logs in one folder (MUONLAB_SLURM_DIR, default
# /tmp/muonlab-slurm-$UID). `install` adds Debian's slurm-wlm and munge (root, apt);
# `start` starts the daemons (root) and waits until the node is idle; `stop` stops them;
# `env` prints the SLURM_CONF line a client needs. Exit 3: cannot run here (the reason on stderr).
set -euo pipefail
DIR=${MUONLAB_SLURM_DIR:-/tmp/muonlab-slurm-$(id -u)}
CONF=$DIR/slurm.conf
cannot() { echo "local SLURM: $*" >&2; exit 3; }

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
  [ "$(id -u)" = 0 ] || cannot "slurm-wlm and munge are not installed, and installing them needs root"
  command -v apt-get >/dev/null || cannot "slurm-wlm and munge are not installed, and there is no apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null \
    || cannot "apt-get install slurm-wlm munge failed"
}

write_conf() {
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/munge"
  local host cpus mem
  # every core, not the one thread the suite's workers ask of OpenMP (nproc honours OMP_NUM_THREADS: a node of one CPU
  # leaves a two-task job pending for ever)
  host=$(hostname -s); cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc); mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
  cat > "$CONF" <<CONF
ClusterName=muonlab-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPort=${MUONLAB_SLURMCTLD_PORT:-16817}
SlurmdPort=${MUONLAB_SLURMD_PORT:-16818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=10
MinJobAge=600
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
}

running() { SLURM_CONF=$CONF timeout 5 scontrol ping 2>/dev/null | grep -q "is UP"; }

start() {
  install
  [ "$(id -u)" = 0 ] || cannot "starting slurmctld and slurmd needs root"
  if [ -f "$CONF" ] && running; then return 0; fi
  write_conf
  local key=/etc/munge/munge.key
  [ -r "$key" ] || cannot "no munge key at $key"
  if ! [ -S "$DIR/munge/munge.socket" ] || ! pgrep -f "munged.*$DIR/munge" >/dev/null; then
    munged --force --key-file "$key" --socket "$DIR/munge/munge.socket" \
      --pid-file "$DIR/munge/munged.pid" --log-file "$DIR/munge/munged.log" --seed-file "$DIR/munge/seed" \
      || cannot "munged did not start (see $DIR/munge/munged.log)"
  fi
  export SLURM_CONF=$CONF
  slurmctld -c -f "$CONF" || cannot "slurmctld did not start (see $DIR/slurmctld.log)"
  slurmd -f "$CONF" || cannot "slurmd did not start (see $DIR/slurmd.log)"
  for _ in $(seq 60); do
    if running && sinfo -h -o %T 2>/dev/null | grep -qx idle; then return 0; fi
    sleep 0.5
  done
  cannot "the node did not come up idle within 30 s (see $DIR/slurmctld.log, $DIR/slurmd.log)"
}

stop() {
  for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
}

case ${1:-} in
  install) install ;;
  start) start; echo "SLURM_CONF=$CONF" ;;
  stop) stop ;;
  env) echo "SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac
