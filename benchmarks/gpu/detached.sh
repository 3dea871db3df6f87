#!/usr/bin/env bash
# A job that outlives the device call that starts it.
#
# The device tool kills what a call leaves running when the call returns, except a
# process in a session of its own, and a call lasts at most 10 minutes. A job longer
# than that (a 70B tensor-parallel server takes most of a call just to start) would
# otherwise be cut at every call boundary and restart its server in the next call.
# Started here, it runs on while the machine is held; later calls only follow it:
#
#   bash benchmarks/gpu/detached.sh start NAME 'COMMAND'   # returns at once
#   bash benchmarks/gpu/detached.sh wait NAME [SECONDS]    # default 540
#
# `start` runs COMMAND (a shell command line) under setsid with OUT set to the job's own
# folder ($DETACHED_DIR/NAME/out; DETACHED_DIR defaults to /tmp/detached), because the
# device empties a call's $OUT before the next command, and in a snapshot of the
# repository ($DETACHED_DIR/NAME/tree, without .bundle/ and gpu-out/), because the device
# copies the working tree afresh for every call while the job is still reading it. `wait` follows the job until it
# ends or SECONDS pass, then copies the job's out/ and its log (job.log) into this
# call's $OUT and prints the log's last lines. Exit status of `wait`: the job's own when
# it has ended, 75 while it still runs (call `wait` again, within the 30 s the machine
# stays held), 2 when there is no such job (a fresh machine lost it). Issue the `wait`
# calls back to back: held time counts whether or not a call is waiting. A `wait` that
# returns before the job's end also packs what the job has written so far (the
# directories DETACHED_PARTIAL names, globs allowed; default: the sitting lanes'
# ${STATE_ROOT:-/tmp}/bs-lane*/results, logs left out) into $OUT/partial.tgz, so a
# machine lost before the next call still leaves the finished passes behind.
set -uo pipefail
usage="usage: detached.sh start NAME 'COMMAND' | detached.sh wait NAME [SECONDS]"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
what=$1 name=$2
case $name in '' | *[!A-Za-z0-9._-]*) echo "detached: bad job name '$name'" >&2; exit 2 ;; esac
JOB=${DETACHED_DIR:-/tmp/detached}/$name
OUT=${OUT:-$(cd "$(dirname "$0")/../.." && pwd)/gpu-out}

case $what in
  start)
    [ $# -eq 3 ] || { echo "$usage" >&2; exit 2; }
    if [ -f "$JOB/pid" ] && [ ! -f "$JOB/rc" ]; then
      echo "detached: job $name is already running (pid $(cat "$JOB/pid"))" >&2; exit 2
    fi
    rm -rf "$JOB"; mkdir -p "$JOB/out" "$JOB/tree"
    repo=$(cd "$(dirname "$0")/../.." && pwd)
    tar cf - -C "$repo" --exclude=./.bundle --exclude=./gpu-out --exclude=./.git . |
      tar xf - -C "$JOB/tree" || { echo "detached: cannot copy $repo" >&2; exit 1; }
    printf '%s\n' "$3" > "$JOB/command"
    # The job's shell writes its pid once it leads a session of its own, and `start`
    # returns only then: until setsid has run, the job is still in the call's process
    # group and would die with it. The rc file is written by the job's shell too, so
    # `wait` sees the end although the job is no child of the call that waits.
    cd "$JOB/tree" && OUT=$JOB/out setsid bash -c 'echo $$ > "$1/pid"; bash "$1/command"; echo $? > "$1/rc.tmp"; mv "$1/rc.tmp" "$1/rc"' \
      detached "$JOB" > "$JOB/job.log" 2>&1 < /dev/null &
    for _ in $(seq 100); do [ -s "$JOB/pid" ] && break; sleep 0.1; done
    [ -s "$JOB/pid" ] || { echo "detached: job $name did not start" >&2; exit 1; }
    echo "detached: started $name (pid $(cat "$JOB/pid"), log $JOB/job.log): $3"
    ;;
  wait)
    [ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
    limit=${3:-540}
    [ -f "$JOB/pid" ] || { echo "detached: no job $name here (a fresh machine?)" >&2; exit 2; }
    start=$SECONDS
    while [ ! -f "$JOB/rc" ] && [ $((SECONDS - start)) -lt "$limit" ]; do
      # A job killed outright (out of memory) writes no rc: stop waiting for it.
      kill -0 "$(cat "$JOB/pid")" 2>/dev/null || break
      sleep 2
    done
    mkdir -p "$OUT"
    cp -r "$JOB/out/." "$OUT/" 2>/dev/null
    cp "$JOB/job.log" "$OUT/job.log"
    echo "== detached job $name, last lines of its log"
    tail -n "${DETACHED_TAIL:-60}" "$JOB/job.log"
    if [ -f "$JOB/rc" ]; then
      rc=$(cat "$JOB/rc"); echo "detached: job $name ended, exit $rc"; exit "$rc"
    fi
    # shellcheck disable=SC2086  # the globs are meant to expand
    partial=$(for d in ${DETACHED_PARTIAL:-${STATE_ROOT:-/tmp}/bs-lane*/results}; do
      [ -d "$d" ] && printf '%s\n' "${d#/}"; done)
    if [ -n "$partial" ]; then
      printf '%s\n' "$partial" | tar czf "$OUT/partial.tgz" -C / --exclude='*.log' -T - &&
        echo "detached: what the job wrote so far: partial.tgz ($(printf '%s\n' "$partial" | tr '\n' ' '))"
    fi
    if kill -0 "$(cat "$JOB/pid")" 2>/dev/null; then
      echo "detached: job $name still running after ${limit}s; call wait again"; exit 75
    else
      echo "detached: job $name died without an exit status (killed?)"; exit 1
    fi
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
