# sandboxd command supervisor (bash). sandboxd starts every command as
#   bash -c 'eval "$SANDBOXD_SUPERVISOR"' NAME supervise GRACE_MS STDIN_BYTES CWD ARGV...
# with SANDBOXD_CMD=<command id> in the environment, which every process the
# command starts inherits, also those that move to a new session or process
# group (setsid, nohup, double fork).
#
# stdin: the first STDIN_BYTES bytes are the command's stdin; after that,
# any line is sandboxd asking to end the command's whole process tree.
#
# The sweep uses only bash builtins (glob, mapfile, kill): under a fork bomb
# at the pids limit no new process could be started to do it, but this one
# already runs.
#
#   ... NAME sweep GRACE_MS COMMAND_ID
# is the fallback, when the supervisor itself is gone, and
#   ... NAME list 0
# prints the ids of commands whose supervisor still runs (after a restart of
# sandboxd, to report them as lost; leftovers of finished commands, such as
# a preview server, do not count).
set -u
# The script itself travels in this variable; the command must not inherit it.
unset SANDBOXD_SUPERVISOR

marked=()
# Fills `marked` with the pids whose environment carries our marker.
find_marked() {
  marked=()
  local d p e
  local -a envs
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    if [ "$p" = "$$" ] || [ "$p" = "${reader:-}" ]; then continue; fi
    mapfile -d '' -t envs 2>/dev/null <"$d/environ" || continue
    for e in "${envs[@]}"; do
      if [ "$e" = "$marker" ]; then marked+=("$p"); break; fi
    done
  done
}

# SIGTERM to the tree, GRACE_MS to go, then SIGSTOP+SIGKILL until no
# process is left (stopped processes cannot fork, so a bomb cannot outrun
# it). Exits 143 when SIGTERM was enough, 137 otherwise.
sweep_and_exit() {
  local grace_us deadline now round
  find_marked
  if [ ${#marked[@]} -gt 0 ]; then
    kill -TERM "${marked[@]}" 2>/dev/null
    grace_us=$((grace * 1000))
    now=${EPOCHREALTIME/./}
    deadline=$((now + grace_us))
    while :; do
      find_marked
      [ ${#marked[@]} -eq 0 ] && break
      now=${EPOCHREALTIME/./}
      [ "$now" -ge "$deadline" ] && break
      # A sleep without a fork: the control pipe has no data while sandboxd
      # holds it open (at EOF this spins, bounded by the deadline).
      read -r -t 0.02 -u "$sleep_fd" _ 2>/dev/null || :
    done
  fi
  if [ ${#marked[@]} -eq 0 ]; then
    [ -n "${child:-}" ] && wait "$child" 2>/dev/null
    exit 143
  fi
  for ((round = 0; round < 1000; round++)); do
    kill -STOP "${marked[@]}" 2>/dev/null
    kill -KILL "${marked[@]}" 2>/dev/null
    find_marked
    [ ${#marked[@]} -eq 0 ] && break
  done
  [ -n "${child:-}" ] && wait "$child" 2>/dev/null
  exit 137
}

mode=$1
grace=$2

if [ "$mode" = list ]; then
  declare -A seen=()
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = "$$" ] && continue
    mapfile -d '' -t argv 2>/dev/null <"$d/cmdline" || continue
    [ "${argv[3]:-}" = sandboxd-supervisor ] && [ "${argv[4]:-}" = supervise ] || continue
    mapfile -d '' -t envs 2>/dev/null <"$d/environ" || continue
    for e in "${envs[@]}"; do
      case $e in SANDBOXD_CMD=*) seen[${e#SANDBOXD_CMD=}]=1 ;; esac
    done
  done
  for k in "${!seen[@]}"; do printf '%s\n' "$k"; done
  exit 0
fi

if [ "$mode" = sweep ]; then
  marker="SANDBOXD_CMD=$3"
  reader=
  sleep_fd=0
  sweep_and_exit
fi

marker="SANDBOXD_CMD=$SANDBOXD_CMD"
nin=$3
cwd=$4
shift 4

if [ -n "$cwd" ]; then
  if ! mkdir -p -- "$cwd" 2>/dev/null || ! cd -- "$cwd"; then
    echo "sandboxd: cannot use $cwd as the working directory" >&2
    exit 126
  fi
fi

if [ "$nin" -gt 0 ]; then
  f="${TMPDIR:-/tmp}/.sandboxd-stdin-$SANDBOXD_CMD"
  if ! head -c "$nin" >"$f"; then
    echo "sandboxd: cannot stage stdin in ${TMPDIR:-/tmp}" >&2
    exit 126
  fi
  exec 3<"$f"
  rm -f -- "$f"
else
  exec 3</dev/null
fi
# The rest of our stdin is the control channel; the command never sees it.
exec 4<&0 0</dev/null

killed=0
trap 'killed=1' USR1
# A background job of a non-interactive shell starts with SIGINT and SIGQUIT
# ignored; the command should see them like in a terminal.
( trap - INT QUIT; exec "$@" ) <&3 3<&- 4<&- &
child=$!
exec 3<&-
{ IFS= read -r _ <&4 && kill -USR1 $$; } &
reader=$!
sleep_fd=4

while :; do
  wait "$child"
  rc=$?
  if [ "$killed" = 1 ]; then
    sweep_and_exit
  fi
  # wait also returns when a trapped signal arrives; only a reaped child ends us.
  if kill -0 "$child" 2>/dev/null; then continue; fi
  break
done
kill "$reader" 2>/dev/null
exit "$rc"
