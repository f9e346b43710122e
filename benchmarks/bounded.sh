# Sourced by the GPU scripts (workflow_gpu.sh, references_gpu.sh): a command bounded in time
# together with every process it starts.
#   run_bounded SECONDS COMMAND [ARGS...]
# runs COMMAND in a session of its own (setsid); after SECONDS the whole session gets SIGTERM
# and, GRACE_S (20) seconds later, SIGKILL; once COMMAND has ended, whatever of its session is
# left is ended too. SECONDS 0: no bound. Returns COMMAND's exit status, 124 when the bound
# stopped it. Why not `timeout` alone: on 2026-11-28 (11:34 UTC) a call bounded snakemake with
# `timeout 290 ... | tee`, and 80 s after that bound the call's own 370 s limit ended it with
# none of its files written: something of the run outlived the bound and held the pipe (which
# was not recorded: a submitit task bypasses SIGTERM and is ended by its controller's SIGINT,
# then SIGKILL; a process holding ~100 GB of pinned memory may take long to exit). Here the
# whole session is signalled, the output goes to a file (no pipe to hold), and the caller goes on.
run_bounded() {
  local seconds=$1; shift
  if [ "$seconds" -le 0 ]; then "$@"; return; fi
  local flag; flag=$(mktemp)
  setsid "$@" &
  local pid=$!
  ( sleep "$seconds"; echo stopped >"$flag"; kill -TERM -- "-$pid" 2>/dev/null
    sleep "${GRACE_S:-20}"; kill -KILL -- "-$pid" 2>/dev/null ) &
  local guard=$!
  wait "$pid"; local rc=$?
  if [ -s "$flag" ]; then  # stopped: its jobs get the rest of the grace to write their records
    rc=124
    for _ in $(seq "${GRACE_S:-20}"); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
  fi
  kill -KILL -- "-$pid" 2>/dev/null  # what the command left running
  kill "$guard" 2>/dev/null; wait "$guard" 2>/dev/null
  rm -f "$flag"
  return "$rc"
}
