#!/usr/bin/env bash
# slurm-cluster.sh: the project's real single-machine Slurm test cluster (`make slurm-up` / `make slurm-down`).
#
#   scripts/slurm-cluster.sh up      install what is missing (apt), write configs, start the daemons, wait for idle nodes
#   scripts/slurm-cluster.sh down    stop only the daemons this script started (by recorded PID); state is kept
#   scripts/slurm-cluster.sh status  recorded PIDs and sinfo
#
# What runs (127.0.0.1 only, no systemd, as root): munged, a private MariaDB (port 6830) behind slurmdbd (6819)
# (submitit reads job states from sacct: without accounting a killed job's result() never returns), slurmctld
# (6817) and one `slurmd -N nodeK` per emulated node (17001..), with fake GPUs as gres (symlinks to /dev/null:
# slurmd 22.05 drops a File-less gpu gres and leaves the node INVAL). The node names resolve to 127.0.0.1 through
# /etc/hosts so a task can use JobEnvironment().hostnames[0] as the torch master address. Memory limits (--mem)
# are enforced without cgroups (jobacct_gather/linux + OverMemoryKill: a step over its limit is killed and the
# job ends FAILED with slurmstepd's "exceeded memory limit" in the task logs, not OUT_OF_MEMORY).
#
# Settings: ORCH_SLURM_DIR (/tmp/orch-slurm-cluster), ORCH_SLURM_NODES (2), ORCH_SLURM_CPUS (8 per node),
# ORCH_SLURM_GPUS (4 per node), ORCH_SLURM_TIMEOUT (60 s per daemon).
set -Eeuo pipefail

STATE=${ORCH_SLURM_DIR:-/tmp/orch-slurm-cluster}
NODES=${ORCH_SLURM_NODES:-2}
CPUS=${ORCH_SLURM_CPUS:-8}
GPUS=${ORCH_SLURM_GPUS:-4}
WAIT_S=${ORCH_SLURM_TIMEOUT:-60}
CLUSTER=orchtest
PARTITION=debug
TAG="# written by orch scripts/slurm-cluster.sh"
CONF_DIR=/etc/slurm
export SLURM_CONF=$CONF_DIR/slurm.conf
PID_DIR=$STATE/run
LOG_DIR=$STATE/log

say() { echo "slurm-cluster: $*" >&2; }
fail() { echo "slurm-cluster: error: $*" >&2; exit 1; }
tail_log() { [[ -s $1 ]] && { echo "--- $1" >&2; grep -v pmix "$1" | tail -n 20 >&2; } || true; }

check_settings() {
  [[ $NODES =~ ^[1-9][0-9]?$ ]] || fail "ORCH_SLURM_NODES must be 1..99, got '$NODES'"
  [[ $CPUS =~ ^[1-9][0-9]*$ ]] || fail "ORCH_SLURM_CPUS must be a positive integer, got '$CPUS'"
  [[ $GPUS =~ ^[0-9]+$ ]] || fail "ORCH_SLURM_GPUS must be an integer >= 0, got '$GPUS'"
  [[ $WAIT_S =~ ^[1-9][0-9]*$ ]] || fail "ORCH_SLURM_TIMEOUT must be a positive integer, got '$WAIT_S'"
  [[ $STATE == /* ]] || fail "ORCH_SLURM_DIR must be absolute, got '$STATE'"
}

# A PID file names a live process of the expected program (zombies count as dead: a late-reaping PID 1
# leaves them behind and kill -0 still succeeds on them).
alive() {  # alive PIDFILE COMM
  local pid st comm
  [[ -r $1 ]] || return 1
  pid=$(tr -dc "0-9" <"$1")
  [[ -n $pid && -r /proc/$pid/stat ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  st=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [[ $comm == "$2"* && $st != Z ]]
}

until_ok() {  # until_ok SECONDS CMD...: poll CMD every 0.2 s
  local end=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    sleep 0.2
  done
}

names() { seq -f "node%g" 1 "$NODES"; }

# ------------------------------------------------------------------ packages
install_missing() {
  local want=(munge slurm-client slurmctld slurmd slurmdbd mariadb-server) need=() p
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || need+=("$p")
  done
  ((${#need[@]})) || return 0
  say "apt-get install ${need[*]}"
  # Keep the packages' maintainer scripts from starting daemons (we start them by hand, no systemd).
  local guard=/usr/sbin/policy-rc.d added=0
  [[ -e $guard ]] || { printf '#!/bin/sh\nexit 101\n' >"$guard" && chmod +x "$guard" && added=1; }
  export DEBIAN_FRONTEND=noninteractive
  local rc=0
  { apt-get install -y -q --no-install-recommends "${need[@]}" ||
    { apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}"; }; } >"$STATE/apt.log" 2>&1 || rc=$?
  ((added)) && rm -f "$guard"
  ((rc == 0)) || { tail_log "$STATE/apt.log"; fail "apt-get install failed (see $STATE/apt.log)"; }
}

# ------------------------------------------------------------------ configs
slurm_conf() {
  local gres="" types="" mem per_cpu ports=17001
  mem=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  # Each CPU's share of the node, at least 2 GiB (a torch rank must fit under the default limit on a small
  # machine); the node then declares at least that much (config_overrides: the nodes share one machine anyway).
  per_cpu=$((mem / CPUS))
  ((per_cpu >= 2048)) || per_cpu=2048
  ((mem >= per_cpu * CPUS)) || mem=$((per_cpu * CPUS))
  ((GPUS > 0)) && { types="GresTypes=gpu"; gres="Gres=gpu:$GPUS"; }
  ((NODES > 1)) && ports="[17001-$((17000 + NODES))]"
  cat <<CONF
$TAG
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=6817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
# No cgroups here: processes tracked through /proc, no CPU/memory/device binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
# Emulated nodes may declare more CPUs than this machine has.
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$PID_DIR/slurmctld.pid
SlurmdPidFile=$PID_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
# Memory is a consumable resource: only then does slurmctld give slurmstepd the job's --mem to enforce
# (OverMemoryKill below; tested: with CR_Core nothing is killed). A job without --mem gets its CPUs' share of
# the node (DefMemPerCPU), so jobs still pack by CPUs as before.
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$per_cpu
# Memory limits without cgroups: slurmstepd samples each task's RSS from /proc every second and kills a step
# whose tasks on a node use more than the job's --mem (the job ends OUT_OF_MEMORY); sacct then has MaxRSS.
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherParams=OverMemoryKill
JobAcctGatherFrequency=task=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobCompType=jobcomp/none
# Requeue on preemption/--requeue is what submitit's checkpointing relies on.
JobRequeue=1
KillWait=5
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
# A node whose slurmd stops answering is DOWN (its jobs NODE_FAIL) SlurmdTimeout after its last answer; slurmctld
# pings every SlurmdTimeout/3, so a live slurmd misses three pings in a row before that happens. 10 s, not 30:
# the node-death test waits this long (tests/slurm), and these slurmds are on the machine that pings them.
SlurmdTimeout=10
Waittime=0
$types
NodeName=node[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$ports CPUs=$CPUS RealMemory=$mem $gres State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
}

gres_conf() {
  echo "$TAG"
  echo "AutoDetect=off"
  local n
  ((GPUS > 0)) || return 0
  for n in $(names); do
    echo "NodeName=$n Name=gpu File=$STATE/gpus/$n/nvidia[0-$((GPUS - 1))]"
  done
}

slurmdbd_conf() {
  cat <<CONF
$TAG
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile=$PID_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=6830
StorageUser=slurm
StoragePass=$(db_password)
StorageLoc=orch_acct_db
CONF
}

db_password() {
  [[ -s $STATE/db.pass ]] || (umask 077 && tr -dc 'a-zA-Z0-9' </dev/urandom | head -c 24 >"$STATE/db.pass")
  cat "$STATE/db.pass"
}

# Returns 0 when the file changed. Refuses to replace a config someone else wrote.
put_conf() {  # put_conf PATH MODE CONTENT
  if [[ -f $1 ]]; then
    [[ $(cat "$1") == "$3" ]] && return 1
    grep -qF "$TAG" "$1" || fail "$1 exists and was not written by this script; move it away first"
  fi
  (umask 077 && printf '%s\n' "$3" >"$1.tmp") && chmod "$2" "$1.tmp" && mv "$1.tmp" "$1"
}

write_configs() {  # prints "changed" when slurm.conf/gres.conf changed
  mkdir -p "$CONF_DIR" "$STATE/spool/ctld" "$PID_DIR" "$LOG_DIR"
  local n i changed=0
  for n in $(names); do
    mkdir -p "$STATE/gpus/$n" "$STATE/spool/$n"
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$STATE/gpus/$n/nvidia$i"; done
  done
  put_conf "$CONF_DIR/slurm.conf" 644 "$(slurm_conf)" && changed=1
  put_conf "$CONF_DIR/gres.conf" 644 "$(gres_conf)" && changed=1
  put_conf "$CONF_DIR/slurmdbd.conf" 600 "$(slurmdbd_conf)" || true
  ((changed)) && echo changed || true
}

add_hosts() {
  local n missing=()
  for n in $(names); do getent hosts "$n" >/dev/null || missing+=("$n"); done
  ((${#missing[@]})) || return 0
  printf '127.0.0.1 %s %s\n' "${missing[*]}" "$TAG" >>/etc/hosts || say "warning: cannot add ${missing[*]} to /etc/hosts"
}

# ------------------------------------------------------------------ daemons
munge_works() { munge -n </dev/null | unmunge >/dev/null; }

start_munge() {
  munge_works 2>/dev/null && return 0  # someone's munged (or ours) already answers: reuse it
  [[ -s /etc/munge/munge.key ]] || { mkdir -p /etc/munge && dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
  chown -R munge:munge /etc/munge && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged --force >>"$LOG_DIR/munged.out" 2>&1 9>&- || true
  until_ok 10 munge_works || { tail_log /var/log/munge/munged.log; fail "munged did not start"; }
  cp /run/munge/munged.pid "$PID_DIR/munged.pid"
}

db() { mariadb --no-defaults -S "$STATE/mysql.sock" -uroot "$@"; }

start_mariadb() {
  alive "$PID_DIR/mariadbd.pid" mariadbd && return 0
  local opts=(--innodb-buffer-pool-size=64M --innodb-log-file-size=8M)
  if [[ ! -d $STATE/mysql/mysql ]]; then
    rm -rf "$STATE/mysql"
    mariadb-install-db --no-defaults --user=root --datadir="$STATE/mysql" --skip-test-db \
      --auth-root-authentication-method=socket "${opts[@]}" >"$LOG_DIR/mariadb-install.log" 2>&1 ||
      { tail_log "$LOG_DIR/mariadb-install.log"; fail "mariadb-install-db failed"; }
  fi
  setsid /usr/sbin/mariadbd --no-defaults --user=root --datadir="$STATE/mysql" --socket="$STATE/mysql.sock" \
    --pid-file="$PID_DIR/mariadbd.pid" --bind-address=127.0.0.1 --port=6830 --skip-name-resolve "${opts[@]}" \
    --log-error="$LOG_DIR/mariadb.log" </dev/null >/dev/null 2>&1 9>&- &
  until_ok "$WAIT_S" db -e 'SELECT 1' || { tail_log "$LOG_DIR/mariadb.log"; fail "MariaDB did not start"; }
  local pw
  pw=$(db_password)
  db -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
         GRANT ALL ON orch_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
}

start_daemon() {  # start_daemon PIDNAME COMM READY_CMD... -- START_CMD...
  local pidname=$1 comm=$2 ready=() run=()
  shift 2
  while [[ $1 != -- ]]; do ready+=("$1") && shift; done
  shift
  run=("$@")
  alive "$PID_DIR/$pidname.pid" "$comm" && return 0
  rm -f "$PID_DIR/$pidname.pid"
  "${run[@]}" >>"$LOG_DIR/$pidname.out" 2>&1 9>&- || { tail_log "$LOG_DIR/$pidname.out"; fail "$pidname did not start"; }
  until_ok "$WAIT_S" "${ready[@]}" || { tail_log "$LOG_DIR/$pidname.log"; fail "$pidname is not answering"; }
}

registered() { local s; s=$(sinfo -h -N -n "$1" -o %t | head -n1); [[ -n $s && $s != *'*' ]]; }
all_idle() { ! sinfo -h -N -o %t | grep -qv -E '^(idle|mix|alloc)$'; }
has_cluster() { sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; }

stop_pidfile() {  # stop_pidfile NAME COMM
  local f=$PID_DIR/$1.pid pid
  alive "$f" "$2" || { rm -f "$f"; return 0; }
  pid=$(tr -dc '0-9' <"$f")
  kill "$pid" 2>/dev/null || true
  until_ok 15 bash -c "! [[ -d /proc/$pid ]] || grep -q '^State:.*Z' /proc/$pid/status" || kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

stop_slurm() {
  local n
  for n in $(names); do stop_pidfile "slurmd-$n" slurmd; done
  stop_pidfile slurmctld slurmctld
}

up() {
  local t0=$SECONDS changed
  install_missing
  changed=$(write_configs)
  add_hosts
  [[ $changed == changed ]] && { say "configuration changed: restarting slurmctld/slurmd"; stop_slurm; }
  start_munge
  start_mariadb
  start_daemon slurmdbd slurmdbd sacctmgr -n list cluster -- /usr/sbin/slurmdbd
  has_cluster || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  start_daemon slurmctld slurmctld scontrol ping -- /usr/sbin/slurmctld
  local n
  for n in $(names); do start_daemon "slurmd-$n" slurmd registered "$n" -- /usr/sbin/slurmd -N "$n"; done
  if ! until_ok "$WAIT_S" all_idle; then
    # A node left DOWN/DRAIN by an earlier run (e.g. killed daemons) is put back into service.
    scontrol update nodename="node[1-$NODES]" state=resume >/dev/null 2>&1 || true
    until_ok "$WAIT_S" all_idle || { sinfo -N >&2; fail "nodes are not idle"; }
  fi
  until_ok 20 srun -N "$NODES" -t 1 true || fail "srun -N $NODES true failed"
  say "up in $((SECONDS - t0)) s: $(sinfo -h -o '%P %D nodes %G' | head -n1)"
}

down() {
  stop_slurm
  stop_pidfile slurmdbd slurmdbd
  stop_pidfile mariadbd mariadbd
  stop_pidfile munged munged  # only a munged this script started has a PID file here
  say "down"
}

status() {
  local f
  for f in "$PID_DIR"/*.pid; do
    [[ -e $f ]] || continue
    echo "$(basename "$f" .pid): $(tr -dc '0-9' <"$f")"
  done
  sinfo 2>/dev/null || echo "no cluster answers"
}

main() {
  check_settings
  case ${1:-} in
    up | down)
      [[ $(id -u) == 0 ]] || fail "run as root (it installs packages, writes /etc/slurm and starts daemons)"
      mkdir -p "$STATE"
      exec 9>"$STATE/.lock"
      flock 9
      "$1"
      ;;
    status) status ;;
    *) fail "usage: $0 up|down|status" ;;
  esac
}

main "$@"
