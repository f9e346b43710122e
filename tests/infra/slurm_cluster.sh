#!/usr/bin/env bash
# A real Slurm cluster of two nodes (slurmctld + slurmdbd on MariaDB, a slurmd on this host and a
# second slurmd in its own network namespace) for integration tests.
#
#   slurm_cluster.sh install       apt-get the Debian packages if missing (root)
#   slurm_cluster.sh start DIR     write config into DIR, start the daemons, wait until usable;
#                                  prints KEY=VALUE lines (SLURM_CONF=...) on stdout, progress on stderr
#   slurm_cluster.sh stop DIR      cancel jobs, stop every daemon by its pid file, wait for exit
#   slurm_cluster.sh status DIR    show the daemons; exit 0 only if all of them run
#   slurm_cluster.sh stop-dbd DIR  stop slurmdbd only: accounting (sacct) down, the cluster up
#   slurm_cluster.sh start-dbd DIR start slurmdbd again and wait until sacct answers
#   slurm_cluster.sh kill-node DIR the second node dies: its slurmd and every process of its jobs
#                                  (all of its network namespace) get SIGKILL
#   slurm_cluster.sh start-node DIR the second node's slurmd again; wait until the node is idle
#
# Why each piece is here:
# - No systemd on the test machines, so every daemon is started by hand and stopped by its pid file.
# - submitit needs `sacct`, and `sacct` needs slurmdbd backed by MariaDB (the file-based accounting
#   plugin is gone); without it a cancelled job's result() waits forever.
# - Snakemake's nested `srun` drops SLURM_CONF, so /etc/slurm/{slurm,gres}.conf become symlinks to DIR.
# - `start` is re-runnable after a crash: stale pid files are ignored, an existing MariaDB datadir and
#   Slurm state are reused. Only one cluster per machine (fixed Slurm ports, /etc/slurm symlinks):
#   `start` refuses while another DIR's cluster runs; the pytest fixture serialises sessions with a lock.
# - The second node (NODE2, `slurmd -N NODE2`) lives in the network namespace NETNS, joined to this
#   host by a veth pair whose two ends are both called IFNAME (10.231.0.1 here, 10.231.0.2 there), in
#   its own UTS namespace (hostname NODE2) and with its own /etc/hosts (/etc/netns/NETNS/hosts: both
#   node names to their veth addresses); its spool, pid and log files carry its name (%n). Where no
#   namespace can be made (or SLURM_CLUSTER_NODES=1) the cluster is the one node on 127.0.0.1.
#   Jobs spanning both nodes need GLOO_SOCKET_IFNAME=IFNAME (this host's name resolves to 127.0.0.1);
#   `start` prints it as HOPPERLAB_SLURM_IFNAME=..., with HOPPERLAB_SLURM_NODES=<node,...>.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
CLUSTER=hopperlab
PARTITION=debug
CTLD_PORT=6817 SLURMD_PORT=6818 DBD_PORT=6819
DB_NAME=slurm_acct_db DB_USER=slurm DB_PASS=hopperlab-slurm
ETC_SLURM=/etc/slurm
LINKED_CONFS=(slurm.conf gres.conf)
NODE2=hl-node2
# (plain "slurmd": the pid file of a cluster started by this script before it had two nodes)
DAEMONS_STOP_ORDER=("slurmd-$NODE2" "slurmd-$(hostname -s)" slurmd slurmctld slurmdbd mariadbd munged)
START_TIMEOUT=${SLURM_CLUSTER_START_TIMEOUT:-120}
NETNS=hopperlab-n2 IFNAME=hlnet0 NET=10.231.0
ADDR1=$NET.1 ADDR2=$NET.2
HOSTS_MARK="# hopperlab test cluster"
# A dead node is declared DOWN (its jobs NODE_FAIL) this many seconds after its last answer.
SLURMD_TIMEOUT=${SLURM_CLUSTER_SLURMD_TIMEOUT:-15}

log() { printf '[slurm_cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root (daemons run as root/munge)"; }

# ---------------------------------------------------------------- install
cmd_install() {
  need_root
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then log "packages already installed"; return 0; fi
  command -v apt-get >/dev/null || die "apt-get not available; cannot install: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  local apt=(apt-get install -y -q --no-install-recommends "${missing[@]}")
  log "installing: ${missing[*]}"
  # Keep postinst scripts from starting system daemons (default config, port 3306, ...): this
  # script starts its own. policy-rc.d exit 101 = "action forbidden" for invoke-rc.d.
  local policy=/usr/sbin/policy-rc.d ours=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && ours=1
  fi
  local rc=0
  # Refresh the index only when the first try cannot find the packages (fresh image, empty lists).
  if ! "${apt[@]}" >&2; then
    apt-get update -q >&2 && "${apt[@]}" >&2 || rc=$?
  fi
  ((ours)) && rm -f "$policy"
  return $rc
}

# ---------------------------------------------------------------- helpers
paths() {
  DIR=$(realpath -m "$1")
  ETC=$DIR/etc RUN=$DIR/run LOGD=$DIR/log
  CTLD_STATE=$DIR/state/slurmctld SLURMD_SPOOL=$DIR/state/slurmd DATADIR=$DIR/mysql
  SOCK=$RUN/mysqld.sock
  export SLURM_CONF=$ETC/slurm.conf
}

pidfile() { echo "$RUN/$1.pid"; }
# slurmd's files carry the node name (SlurmdPidFile=...-%n.pid): one per node.
slurmd_pidfile() { echo "$RUN/slurmd-$1.pid"; }

# Alive and not a zombie: daemons are reparented to PID 1, which may reap them late.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

# Pid from DAEMON's pid file if that process is alive and really is DAEMON (pids get reused).
live_pid() {
  local f pid comm
  f=$(pidfile "$1")
  [[ -s $f ]] || return 1
  pid=$(tr -dc '0-9' <"$f")
  [[ -n $pid ]] && alive "$pid" || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
  [[ $comm == "${1%%-*}" || ($1 == mariadbd && $comm == mysqld) ]] || return 1
  echo "$pid"
}

# wait_for SECONDS DESCRIPTION CMD...: poll CMD every 0.2 s.
wait_for() {
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "timed out after ${secs}s waiting for $what"; return 1; }
    sleep 0.2
  done
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
  local p
  for p in $(seq "$1" $(($1 + 200))); do port_in_use "$p" || { echo "$p"; return 0; }; done
  die "no free port from $1"
}

show_logs() {
  local f
  for f in "$LOGD"/*.log; do
    [[ -s $f ]] || continue
    log "---- tail of $f"
    tail -n 15 "$f" >&2 || true
  done
}

# ---------------------------------------------------------------- config
# write_configs DB_PORT TWO: TWO=1 adds NODE2 (its veth address) and moves this node to ADDR1.
write_configs() {
  local host cpus mem_mb db_port=$1 two=$2 addr=127.0.0.1 nodes
  host=$(hostname -s)
  # nproc obeys OMP_NUM_THREADS; a test that left it at 1 must not shrink the cluster.
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.85}' /proc/meminfo)
  nodes=$host
  ((two)) && { addr=$ADDR1; nodes=$host,$NODE2; }

  cat >"$ETC/slurm.conf" <<EOF
# Written by tests/infra/slurm_cluster.sh; test cluster of the nodes $nodes.
ClusterName=$CLUSTER
SlurmctldHost=$host($addr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
StateSaveLocation=$CTLD_STATE
# %n: the node's name, so that the two slurmds of this host keep their files apart.
SlurmdSpoolDir=$SLURMD_SPOOL-%n
SlurmctldPidFile=$(pidfile slurmctld)
SlurmdPidFile=$(slurmd_pidfile %n)
SlurmctldLogFile=$LOGD/slurmctld.log
SlurmdLogFile=$LOGD/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in the test VM/container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Start batch jobs at once instead of up to 3 s after submission.
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default the first job takes all memory and jobs run one at a time.
DefMemPerCPU=1000
GresTypes=gpu
# Jobs stay visible to squeue/scontrol for 5 min; accounting goes to slurmdbd (needed by submitit).
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none
AccountingStorageTRES=gres/gpu
# Time limits act as soon as Slurm checks them, so timeout tests stay short.
OverTimeLimit=0
KillWait=2
InactiveLimit=0
ReturnToService=2
# A node that stops answering is DOWN (its jobs NODE_FAIL) after this long, not the default 300 s.
SlurmdTimeout=$SLURMD_TIMEOUT
# Weight: one-node jobs go to this host's node first, the second only when the first is full.
NodeName=$host NodeAddr=$addr CPUs=$cpus RealMemory=$mem_mb Gres=gpu:1 Weight=1 State=UNKNOWN
EOF
  if ((two)); then
    echo "NodeName=$NODE2 NodeHostname=$NODE2 NodeAddr=$ADDR2 CPUs=$cpus" \
      "RealMemory=$mem_mb Gres=gpu:1 Weight=100 State=UNKNOWN" >>"$ETC/slurm.conf"
  fi
  echo "PartitionName=$PARTITION Nodes=$nodes Default=YES MaxTime=INFINITE State=UP" \
    >>"$ETC/slurm.conf"

  # A fake GPU so --gpus=1 schedules on a CPU machine (Count= alone makes the node INVAL).
  printf 'AutoDetect=off\nNodeName=%s Name=gpu File=/dev/null\n' "$host" >"$ETC/gres.conf"
  if ((two)); then printf 'NodeName=%s Name=gpu File=/dev/null\n' "$NODE2" >>"$ETC/gres.conf"; fi

  # slurmdbd refuses a config not owned by SlurmUser with mode 600.
  install -m 600 -o root -g root /dev/null "$ETC/slurmdbd.conf"
  cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$(pidfile slurmdbd)
LogFile=$LOGD/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
}

# /etc/slurm/X -> DIR/etc/X so commands without SLURM_CONF (nested srun) find this cluster.
# A real file that is not ours is moved aside once and put back by `stop`.
link_configs() {
  mkdir -p "$ETC_SLURM"
  local c dst
  for c in "${LINKED_CONFS[@]}"; do
    dst=$ETC_SLURM/$c
    if [[ -e $dst && ! -L $dst && ! -e $dst.hopperlab-backup ]]; then
      log "backing up $dst to $dst.hopperlab-backup"
      mv "$dst" "$dst.hopperlab-backup"
    fi
    ln -sfn "$ETC/$c" "$dst"
  done
}

unlink_configs() {
  local c dst
  for c in "${LINKED_CONFS[@]}"; do
    dst=$ETC_SLURM/$c
    if [[ -L $dst && $(readlink "$dst") == "$ETC/$c" ]]; then
      rm -f "$dst"
      [[ -e $dst.hopperlab-backup ]] && mv "$dst.hopperlab-backup" "$dst"
    fi
  done
  return 0
}

# Another DIR's cluster holds the fixed ports and the /etc/slurm links. Refuse rather than kill it:
# only the caller knows whether it is stale (the pytest fixture, holding the lock, stops it first).
other_cluster_dir() {
  local link=$ETC_SLURM/slurm.conf
  [[ -L $link ]] || return 1
  dirname "$(dirname "$(readlink "$link")")"
}

refuse_other_live_cluster() {
  local other d
  other=$(other_cluster_dir) || return 0
  [[ $other != "$DIR" && -d $other/run ]] || return 0
  for d in "${DAEMONS_STOP_ORDER[@]}"; do
    if (paths "$other" && live_pid "$d" >/dev/null); then
      die "a cluster from $other is running; stop it first: $0 stop $other"
    fi
  done
}

# ---------------------------------------------------------------- daemons
start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "munged already answering"
    return 0
  fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    install -d -m 700 -o munge -g munge /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null ||
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  install -d -m 755 -o munge -g munge /run/munge
  install -d -m 700 -o munge -g munge /var/log/munge /var/lib/munge
  install -d -m 755 -o munge -g munge "$RUN/munge"
  rm -f "$RUN/munged.pid"
  # munged insists on running as the owner of its key; --force gets past a stale socket after a crash.
  runuser -u munge -- munged --force --pid-file="$RUN/munge/munged.pid"
  ln -sfn munge/munged.pid "$RUN/munged.pid"
  wait_for 15 munged bash -c 'munge -n </dev/null | unmunge'
}

start_mariadb() {
  local port=$1
  if [[ ! -d $DATADIR/mysql ]]; then
    log "initialising MariaDB datadir $DATADIR"
    rm -rf "$DATADIR"
    mariadb-install-db --no-defaults --user=root --datadir="$DATADIR" \
      --auth-root-authentication-method=socket --skip-test-db >"$LOGD/mariadb-install.log" 2>&1 ||
      { tail -n 20 "$LOGD/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
  fi
  rm -f "$SOCK" "$SOCK.lock"
  # --no-defaults: keep /etc/mysql (and a system MariaDB on 3306) out of it.
  setsid mariadbd --no-defaults --user=root --datadir="$DATADIR" --socket="$SOCK" \
    --pid-file="$(pidfile mariadbd)" --bind-address=127.0.0.1 --port="$port" \
    --log-error="$LOGD/mariadb.log" --skip-log-bin --innodb-lock-wait-timeout=900 \
    </dev/null >/dev/null 2>&1 &
  disown
  wait_for 60 MariaDB mariadb-admin --no-defaults --socket="$SOCK" -u root ping ||
    { show_logs; die "MariaDB did not start"; }
  mariadb --no-defaults --socket="$SOCK" -u root <<EOF
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
EOF
}

node_state() { sinfo -h -N -n "${1:-$(hostname -s)}" -o %T 2>/dev/null | head -n 1; }
node_idle() { [[ $(node_state "${1:-}") == idle ]]; }

# wait_idle NODE: idle, resuming it once if a crashed run left it down/drained (ReturnToService
# does not clear a drain).
wait_idle() {
  wait_for 20 "node $1 idle" node_idle "$1" && return 0
  scontrol update nodename="$1" state=resume 2>/dev/null || true
  wait_for "$START_TIMEOUT" "node $1 idle" node_idle "$1" || { show_logs; die "node $1 is $(node_state "$1"), not idle"; }
}

# ---------------------------------------------------------------- the second node
netns_up() { ip netns list 2>/dev/null | grep -qw "^$NETNS"; }

# The namespace, the veth pair (IFNAME on both sides) and its /etc/hosts; 1 if the kernel refuses.
make_netns() {
  drop_netns
  ip netns add "$NETNS" || return 1
  ip link add "$IFNAME" type veth peer name "${IFNAME}p" || return 1
  ip link set "${IFNAME}p" netns "$NETNS" &&
    ip netns exec "$NETNS" ip link set "${IFNAME}p" name "$IFNAME" &&
    ip addr add "$ADDR1/24" dev "$IFNAME" && ip link set "$IFNAME" up &&
    ip netns exec "$NETNS" ip addr add "$ADDR2/24" dev "$IFNAME" &&
    ip netns exec "$NETNS" ip link set "$IFNAME" up &&
    ip netns exec "$NETNS" ip link set lo up &&
    ip netns exec "$NETNS" ip route add default via "$ADDR1" || return 1
  # The second node's /etc/hosts (start_node2 binds it): both nodes by their veth address.
  mkdir -p "/etc/netns/$NETNS"
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$ADDR1" "$(hostname -s)" "$ADDR2" "$NODE2" \
    >"/etc/netns/$NETNS/hosts"
  # Here, NODE2 by its address too (a job's rank 0 may be there: MASTER_ADDR names it), in a line
  # of ours that drop_netns takes out again. This host's name keeps resolving to 127.0.0.1.
  echo "$ADDR2 $NODE2 $HOSTS_MARK" >>/etc/hosts
}

# Every process of the namespace (the node's slurmd, slurmstepds, job tasks) gets SIGKILL.
kill_netns_procs() {
  netns_up || return 0
  local pids
  pids=$(ip netns pids "$NETNS" 2>/dev/null | tr '\n' ' ')
  [[ -n ${pids// /} ]] || return 0
  log "killing the processes of $NETNS: $pids"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  wait_for 10 "$NETNS to empty" bash -c "[[ -z \$(ip netns pids $NETNS) ]]" || true
}

drop_netns() {
  kill_netns_procs
  ip link del "$IFNAME" 2>/dev/null || true
  if netns_up; then ip netns del "$NETNS" 2>/dev/null || true; fi
  rm -rf "/etc/netns/$NETNS"
  if grep -q "$HOSTS_MARK" /etc/hosts 2>/dev/null; then
    # rewritten in place (not sed -i's rename): /etc/hosts may be a mount point
    local kept
    kept=$(grep -v "$HOSTS_MARK" /etc/hosts || true)
    printf '%s\n' "$kept" >/etc/hosts
  fi
  return 0
}

# slurmd -N NODE2 in the namespace, with its own hostname (a UTS namespace of its own) and its
# /etc/hosts (a private mount namespace). Not `ip netns exec`: its fresh /sys hides the cgroup
# mounts that slurmd's start needs.
start_node2() {
  rm -f "$(slurmd_pidfile "$NODE2")"
  nsenter --net="/run/netns/$NETNS" unshare --mount --uts bash -c \
    "mount --bind /etc/netns/$NETNS/hosts /etc/hosts && hostname $NODE2 &&
     exec slurmd -f '$SLURM_CONF' -N $NODE2" || return 1
}
cluster_registered() { sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; }
sacct_answers() { sacct -n -X -S now >/dev/null 2>&1; }

cmd_start() {
  need_root
  [[ -n ${1:-} ]] || die "usage: $0 start DIR"
  paths "$1"
  local t0=$SECONDS d
  for d in "${DAEMONS_STOP_ORDER[@]}"; do
    if live_pid "$d" >/dev/null; then
      log "$d already running from $DIR; restarting the cluster"
      cmd_stop "$DIR"
      paths "$1"
      break
    fi
  done
  refuse_other_live_cluster
  for p in $CTLD_PORT $SLURMD_PORT $DBD_PORT; do
    port_in_use "$p" && die "port $p is in use by something else (another Slurm?)"
  done
  mkdir -p "$ETC" "$RUN" "$LOGD" "$CTLD_STATE"
  chmod 755 "$DIR" "$ETC" "$RUN"
  local db_port two=0 host
  host=$(hostname -s)
  db_port=$(free_port 13306)
  if [[ ${SLURM_CLUSTER_NODES:-2} == 2 ]]; then
    if make_netns; then two=1; else log "no network namespace here: one node only"; drop_netns; fi
  fi
  write_configs "$db_port" "$two"
  mkdir -p "$SLURMD_SPOOL-$host" "$SLURMD_SPOOL-$NODE2"
  link_configs

  start_munge
  start_mariadb "$db_port"
  rm -f "$(pidfile slurmdbd)" "$(pidfile slurmctld)" "$(slurmd_pidfile "$host")"
  slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster || { show_logs; die "slurmdbd did not answer"; }
  slurmctld
  wait_for 30 slurmctld scontrol ping || { show_logs; die "slurmctld did not answer"; }
  slurmd -N "$host"
  ((two)) && { start_node2 || { show_logs; die "the second slurmd ($NODE2) did not start"; }; }
  # slurmctld adds the cluster to the accounting DB when it first connects to slurmdbd.
  wait_for "$START_TIMEOUT" "cluster registration" cluster_registered || { show_logs; die "cluster not in accounting DB"; }
  wait_idle "$host"
  ((two)) && wait_idle "$NODE2"
  wait_for 30 sacct sacct_answers || { show_logs; die "sacct does not answer"; }
  log "cluster up in $((SECONDS - t0))s (SLURM_CONF=$SLURM_CONF)"
  echo "SLURM_CONF=$SLURM_CONF"
  if ((two)); then echo "HOPPERLAB_SLURM_NODES=$host,$NODE2"; echo "HOPPERLAB_SLURM_IFNAME=$IFNAME"
  else echo "HOPPERLAB_SLURM_NODES=$host"; fi
}

# ---------------------------------------------------------------- stop / status
stop_daemon() {
  local name=$1 pid i
  if pid=$(live_pid "$name"); then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do # 30 s; MariaDB flushes on shutdown
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      log "$name ($pid) ignored SIGTERM; killing"
      kill -KILL "$pid" 2>/dev/null || true
      while alive "$pid"; do sleep 0.1; done
    fi
    log "stopped $name ($pid)"
  fi
  rm -f "$(pidfile "$name")"
}

cmd_stop() {
  need_root
  [[ -n ${1:-} ]] || die "usage: $0 stop DIR"
  paths "$1"
  [[ -d $RUN ]] || { log "nothing to stop in $DIR"; return 0; }
  # Cancel leftover jobs first so their processes do not outlive the cluster.
  if live_pid slurmctld >/dev/null; then
    local jobs
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ' || true)
    if [[ -n ${jobs// /} ]]; then
      log "cancelling jobs: $jobs"
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null || true
      wait_for 10 "jobs to end" bash -c '[[ -z $(squeue -h -t running,completing -o %A) ]]' || true
    fi
  fi
  local d
  for d in "${DAEMONS_STOP_ORDER[@]}"; do stop_daemon "$d"; done
  drop_netns
  rm -rf "$RUN/munge"
  unlink_configs
}

cmd_status() {
  [[ -n ${1:-} ]] || die "usage: $0 status DIR"
  paths "$1"
  local d pid ok=0
  for d in munged mariadbd slurmdbd slurmctld "slurmd-$(hostname -s)"; do
    if pid=$(live_pid "$d"); then
      printf '%-10s running (pid %s)\n' "$d" "$pid"
    elif [[ $d == munged ]] && munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
      printf '%-10s running (not started by us)\n' "$d"
    else
      printf '%-10s stopped\n' "$d"
      ok=3
    fi
  done
  if pid=$(live_pid "slurmd-$NODE2"); then
    printf '%-10s running (pid %s, namespace %s)\n' "slurmd-$NODE2" "$pid" "$NETNS"
  fi
  if live_pid slurmctld >/dev/null; then sinfo -N -o '%N %P %T %G' 2>/dev/null || true; fi
  return $ok
}

# The second node dies: its slurmd and the processes of its jobs, all at once (SIGKILL).
cmd_kill_node() {
  need_root
  paths "${1:?usage: $0 kill-node DIR}"
  netns_up || die "no second node ($NETNS) to kill"
  kill_netns_procs
  rm -f "$(slurmd_pidfile "$NODE2")"
}

cmd_start_node() {
  need_root
  paths "${1:?usage: $0 start-node DIR}"
  netns_up || die "no second node ($NETNS): the cluster runs one node"
  live_pid "slurmd-$NODE2" >/dev/null || start_node2 || die "the second slurmd did not start"
  wait_idle "$NODE2"
}

# An accounting outage for tests: slurmctld keeps running jobs (and caches their records) while
# slurmdbd is away, and sends what it cached once it is back.
cmd_stop_dbd() {
  need_root
  [[ -n ${1:-} ]] || die "usage: $0 stop-dbd DIR"
  paths "$1"
  stop_daemon slurmdbd
}

cmd_start_dbd() {
  need_root
  [[ -n ${1:-} ]] || die "usage: $0 start-dbd DIR"
  paths "$1"
  if ! live_pid slurmdbd >/dev/null; then
    rm -f "$(pidfile slurmdbd)"
    slurmdbd
  fi
  wait_for 60 sacct sacct_answers || { show_logs; die "sacct does not answer"; }
}

case ${1:-} in
  install) cmd_install ;;
  start) cmd_start "${2:-}" ;;
  stop) cmd_stop "${2:-}" ;;
  status) cmd_status "${2:-}" ;;
  stop-dbd) cmd_stop_dbd "${2:-}" ;;
  start-dbd) cmd_start_dbd "${2:-}" ;;
  kill-node) cmd_kill_node "${2:-}" ;;
  start-node) cmd_start_node "${2:-}" ;;
  *)
    echo "usage: $0 {install|start DIR|stop DIR|status DIR|stop-dbd DIR|start-dbd DIR|kill-node DIR|start-node DIR}" >&2
    exit 2
    ;;
esac
